"""``python -m nli.xla_launch ARGS``: one process per XLA device of a TPU host, each running ``python -m nli
ARGS`` (``nli.node`` runs it on a TPU host). PyTorch/XLA's launcher (``torch_xla.launch``) starts them.

A process starter, like ``nli.__main__`` and ``nli.node``: nothing in the library imports it. The device,
the processes' collectives and the compile counts are nli.runtime.xla's.

Signals reach the launcher alone: it passes SIGTERM, SIGINT and SIGUSR1 on to its processes. PyTorch/XLA
runs each process's run in a thread of its own, where no signal arrives; each process's main thread
notes the signal for the run (nli.runtime.signals.relay_to_threads), which checkpoints and stops as anywhere else.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from concurrent.futures.process import BrokenProcessPool
from types import FrameType
from typing import List, Optional

from nli.contract import PREEMPTED
from nli.errors import ConfigError
from nli.runtime.signals import relay_to_threads
from nli.runtime.xla import NO_DEVICE, runtime


def _replica(index: int) -> None:
    """One process of ``python -m nli.xla_launch``: the run, with the arguments the launcher got (spawn gives
    each process the parent's sys.argv)."""
    from nli.__main__ import main

    main()


_forwarded: List[str] = []  # the signals launch() passed on


def _forward(signum: int, frame: Optional[FrameType]) -> None:
    """The platform signals the launcher alone; each process checkpoints and stops on its own signal."""
    _forwarded.append(signal.Signals(signum).name)
    for child in multiprocessing.active_children():
        if child.pid is not None:
            os.kill(child.pid, signum)


def launch() -> None:
    """One process per XLA device of this host, each running ``python -m nli`` with this command's
    arguments; signals sent to this process reach them all."""
    try:
        torch_xla = runtime()
    except ConfigError as missing:  # one line, as train.py says it
        raise SystemExit(f"error: {missing}") from None
    import torch_xla._internal.tpu as tpu

    if os.environ["PJRT_DEVICE"] == "TPU" and not tpu.num_available_chips():  # torch_xla.launch would start none
        raise SystemExit(f"error: python -m nli.xla_launch found no TPU chip on this machine: {NO_DEVICE}")
    for name in ("SIGTERM", "SIGINT", "SIGUSR1"):
        signal.signal(signal.Signals[name], _forward)
    try:
        torch_xla.launch(_replica)
    except BrokenProcessPool:
        if not _forwarded:
            raise
        # A process the signal ended at once: one still importing torch, before its relay was in place (nothing
        # of its run had started), or one on a second signal (its last checkpoint stands).
        print(f"stopped by {_forwarded[0]}: a process ended at once, before its run could save more; what its "
              "checkpoints hold is kept. Run the same command again to continue", file=sys.stderr)
        raise SystemExit(PREEMPTED) from None


if __name__ == "__main__":
    launch()
elif __name__ == "__mp_main__":
    # A process launch() started: spawn runs this module as __mp_main__ in its main thread, and PyTorch/XLA
    # then runs the run in a thread of its own, where no signal arrives (nli.runtime.signals).
    relay_to_threads()
