"""SIGTERM and SIGINT as a request to stop at the next step boundary.

Vertex AI sends SIGTERM before it reclaims a spot VM, Slurm before a time limit, and Ctrl-C
sends SIGINT. Instead of dying mid-step, the run finishes the step, writes a checkpoint and
exits; started again, it continues from there. A second Ctrl-C stops at once.

Under submitit (hydra/launcher=submitit_slurm), Slurm warns a job with submitit's signal (USR2)
before its time limit or a preemption, and submitit's handler requeues it. That signal stops the
run the same way, and once the checkpoint is written `hand_over()` passes it on to submitit, so the
requeued job continues from this very step.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType
from typing import Any, Dict, Optional

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """While active (``with StopRequest() as stop:``), ``stop.signal`` names the signal that
    asked the run to stop, or is None."""

    def __init__(self) -> None:
        self.signal: Optional[str] = None
        self._requeue = submitit_signal()
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            signals = (*SIGNALS, self._requeue) if self._requeue else SIGNALS
            self._previous = {s: signal.signal(s, self._handle) for s in signals}
        return self

    def hand_over(self) -> None:
        """After the stop's checkpoint: if submitit's signal asked for the stop, run submitit's own
        handler, which requeues the job and ends this process."""
        handler = self._previous.get(self._requeue) if self._requeue else None
        if self._requeue and self.signal == self._requeue.name and callable(handler):
            log.warning("handing %s over to submitit, which requeues the job", self.signal)
            handler(self._requeue, None)

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # pressed twice: stop now
        self.signal = name
        log.warning("%s received: stopping after this step, with a checkpoint", name)


def submitit_signal() -> Optional[signal.Signals]:
    """The signal submitit requeues a job on, when this process is a submitit job (it sets
    SUBMITIT_EXECUTOR); USR2 unless SUBMITIT_PREEMPT_SIGNAL names another."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    return signal.Signals[f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}"]
