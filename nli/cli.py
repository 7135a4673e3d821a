"""The task function ``train.py`` and ``python -m nli`` hand to Hydra; their ``--help`` is nli/help.py.

The one place a run's errors are handled: an error the user can fix (:class:`nli.errors.UserError`)
ends the run with its message and no traceback, and a run stopped by a signal, its checkpoint
written, exits with status ``PREEMPTED`` (75) to be run again.
"""

from __future__ import annotations

import logging
import sys
from typing import cast

from omegaconf import DictConfig, OmegaConf

from nli.config import Config
from nli.contract import PREEMPTED
from nli.errors import UserError
from nli.signals import Preempted

log = logging.getLogger(__name__)


def train(raw: DictConfig) -> float:
    """Hydra's task function: run, and return the objective for sweepers to maximise. The config's
    rules are checked before torch and transformers load (about 9 s), so a wrong value is answered
    in a second."""
    try:
        cfg = cast(Config, OmegaConf.to_object(raw))  # checks every rule
        from nli import recipe

        return float(recipe.run(cfg, raw)["objective"])
    except Preempted as stop:
        message = (f"preempted, resumable: {stop.signal} at step {stop.step}, checkpoint written. "
                   "Run the same command again to continue")
        log.warning("%s", message)
        print(message, file=sys.stderr)
        raise SystemExit(PREEMPTED) from None
    except UserError as err:
        log.error("%s", err)
        raise SystemExit(f"error: {err}") from None
