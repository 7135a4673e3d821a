"""What an output folder already holds, and whether this run may go on there.

A folder holds one run. Started again with the same settings (the same identity: nli.identity), a
run continues from its newest checkpoint, or, finished, reports its results again. With other
settings it is refused before anything loads, each change listed, unless every change is one the
user accepts for continuing (``train.accept_changes``); a finished run so accepted trains on.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, Mapping, Optional

import yaml

from nli import contract
from nli.checkpoint import Checkpoints
from nli.config import TrainConfig
from nli.errors import CheckpointError
from nli.identity import differences, digest, identity, refuse
from nli.storage import Storage

log = logging.getLogger(__name__)


def earlier_run(train: TrainConfig, ident: Mapping[str, Any], storage: Storage,
                checkpoints: Checkpoints) -> Optional[Dict[str, Any]]:
    """The results of this very run if it already finished; None if it is to start or continue.
    Raises, touching nothing, where the folder holds another run or ``train.resume=false`` forbids it."""
    newest = checkpoints.newest_step()
    if newest is not None and not train.resume:
        raise CheckpointError(f"{checkpoints.where()} holds a checkpoint of step {newest} and train.resume=false "
                              "refuses to continue or overwrite it. Choose another output_dir (or hydra.run.dir) "
                              "to start afresh, delete that folder, or drop train.resume=false to continue")
    finished = _results(storage)
    if finished is None and newest is None:
        return None  # a new run
    saved = _saved_identity(storage, checkpoints, newest)
    changes = differences(saved, ident) if saved is not None else {}
    if saved is None and finished is not None and finished.get("identity") != digest(ident):
        changes = {"(settings)": "not recorded by the earlier run -> these"}
    what = "a finished run" if finished is not None else f"a run stopped at step {newest}"
    unaccepted = [key for key in changes if key not in train.accept_changes]
    if unaccepted:
        raise refuse(storage.describe(), what, changes)
    if changes:
        log.warning("%s holds %s; continuing it with new values (train.accept_changes): %s", storage.describe(),
                    what, "; ".join(f"{key}: {change}" for key, change in changes.items()))
        return None
    if finished is not None:
        log.info("this run already finished; its results, from %s: %s", storage.describe(contract.RESULTS_FILE),
                 json.dumps(finished))
    return finished


def _results(storage: Storage) -> Optional[Dict[str, Any]]:
    if not storage.exists(contract.RESULTS_FILE):
        return None
    return dict(json.loads(storage.read_bytes(contract.RESULTS_FILE)))


def _saved_identity(storage: Storage, checkpoints: Checkpoints, newest: Optional[int]) -> Optional[Dict[str, Any]]:
    """The earlier run's identity: its newest checkpoint's, else what its config.yaml gives."""
    if newest is not None:
        saved = checkpoints.identity_of(newest)
        if saved is not None:
            return saved
    if storage.exists(contract.CONFIG_FILE):
        return identity(yaml.safe_load(storage.read_bytes(contract.CONFIG_FILE)))
    return None
