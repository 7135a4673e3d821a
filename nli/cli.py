"""The task function ``train.py`` and ``python -m nli`` hand to Hydra; their ``--help`` is nli/help.py.

The one place a run's errors are handled: an error the user can fix (:class:`nli.errors.UserError`)
ends the run with its message and no traceback (in a sweep, it fails that job alone: nli.sweep),
and a run stopped by a signal, its checkpoint written, exits with status ``PREEMPTED`` (75) to be
run again.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn, cast

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from nli import cpu, platform
from nli.config import Accelerator, Config
from nli.contract import PREEMPTED
from nli.errors import JobFailed, UserError
from nli.signals import Interrupted, Preempted, StopRequest
from nli.storage import Storage

log = logging.getLogger(__name__)

# What a run stopped at once had saved, by how far it had come (nli.signals.Interrupted.stage).
INTERRUPTED = {
    "starting": "before training began: nothing new was saved (checkpoints already in the output folder are as "
                "they were). Run the same command again to start",
    "training": "at once (a second signal), in the middle of a step: that step was not saved. Run the same command "
                "again to continue from the last checkpoint",
    "evaluating": "during an evaluation-only run: it writes nothing until its results, so nothing was lost. Run the "
                  "same command again to evaluate",
    "finishing": "after training, before its results were written: training is complete and checkpointed. Run the "
                 "same command again to export the best model and write the results",
}


def train(raw: DictConfig) -> float:
    """Hydra's task function: run, and return the objective for sweepers to maximise. The config's
    rules are checked before torch and transformers load (about 9 s), so a wrong value is answered
    in a second."""
    try:
        cfg = cast(Config, OmegaConf.to_object(raw))  # checks every rule
        site = platform.detect()
        # From here on a signal stops the run cleanly, and the machine's other runs count this one.
        with StopRequest(requeue=site.requeue_signal) as stop, cpu.Sharing(cfg.hw.cpu_threads,
                                                                           site.local_processes) as sharing:
            _preflight(cfg, site)
            try:
                from nli import recipe  # torch and transformers: seconds

                return float(recipe.run(cfg, raw, site, stop, sharing)["objective"])
            except (Preempted, Interrupted):
                stop.hand_over()  # the run has stopped: the platform may requeue the job now
                raise
    except Preempted as stop:
        _stop(f"preempted, resumable: {stop.signal} at step {stop.step}, checkpoint written. "
              "Run the same command again to continue")
    except Interrupted as stop:
        _stop(f"stopped by {stop.signal} {INTERRUPTED[stop.stage]}")
    except UserError as err:
        log.error("%s", err)
        if _in_sweep():  # one job's mistake: the sweep goes on, and ends non-zero naming it (nli.sweep)
            raise JobFailed(f"error: {err}") from None
        raise SystemExit(f"error: {err}") from None


def _in_sweep() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _stop(message: str) -> NoReturn:
    """A run stopped by a signal: the message in its log and on the console, and the status that
    says "run me again"."""
    log.warning("%s", message)
    print(message, file=sys.stderr)
    raise SystemExit(PREEMPTED) from None


def _preflight(cfg: Config, site: platform.Site) -> None:
    """A Cloud Storage output folder's bucket and credentials, checked on rank 0 before torch loads: a
    wrong one is answered in seconds, not after the import (the run's setup checks all the rest).
    On XLA, the TPU asked of PyTorch/XLA before datasets and transformers import it: on its own it
    falls back to the CPU where it finds none, and the run would train there, slowly, unsaid."""
    if cfg.hw.accelerator == Accelerator.xla:
        os.environ.setdefault("PJRT_DEVICE", "TPU")
    url = cfg.output_dir or site.output_dir
    if url and "://" in url and int(site.process_env.get("RANK", "0")) == 0:
        Storage(url).check_writable()
