"""Checkpoints that survive preemption: written whole or not at all, verified when read.

A checkpoint is a folder ``checkpoints/step-000120/`` holding ``state.pt`` (model, optimizer,
schedule, loss scaler, every random generator, the position in the data, the best evaluation,
the logger's run id), the tokenizer, and last ``checkpoint.json``: the manifest with each file's
size and SHA-256. A folder without a manifest is a save that never finished and is ignored; a
file that does not match its manifest is reported, and the previous checkpoint is used instead.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import random
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from nli.metrics import Evaluation
from nli.storage import Storage

log = logging.getLogger(__name__)

MANIFEST = "checkpoint.json"
STATE = "state.pt"
_NAME = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """No usable checkpoint, or one that belongs to another run; the message says what to do."""


@dataclass
class Progress:
    """Where training stands, in units that survive a restart."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # the epoch in progress
    examples_in_epoch: int = 0  # examples of that epoch already trained on, by all processes (any world size)
    examples: int = 0  # training examples seen, by all processes
    tokens: int = 0  # their real (non-pad) tokens
    seconds: float = 0.0  # time spent in training steps, over every attempt
    nonfinite_steps: int = 0  # steps skipped for a non-finite loss (train.skip_nonfinite)

    @classmethod
    def saved(cls, state: Dict[str, Any], *, examples_per_epoch: int) -> "Progress":
        """The progress a checkpoint recorded. Checkpoints from before data parallelism counted the
        epoch's micro-batches (of a size the checkpoint does not hold); the examples seen in all
        tell how far into the epoch they were."""
        state = dict(state)
        if "batches_in_epoch" in state:
            del state["batches_in_epoch"]
            state["examples_in_epoch"] = state["examples"] - state["epoch"] * examples_per_epoch
        return cls(**state)


@dataclass
class Resumed:
    """What a checkpoint hands back to the run."""

    name: str
    state: Dict[str, Any]  # model, optimizer, scheduler, scaler, rng
    progress: Progress
    best: Optional[Evaluation]
    tracker_id: Optional[str]
    tokenizer_dir: Path  # a local copy of the checkpoint's tokenizer


def rng_state() -> Dict[str, Any]:
    """Every random generator the run draws from, in a form ``torch.load(weights_only=True)`` reads."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng(state: Dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    """Saves and finds the checkpoints of one run, one folder each under ``storage``."""

    def __init__(self, storage: Storage, *, keep: int, identity: Dict[str, Any]) -> None:
        self.storage, self.keep, self.identity = storage, keep, identity

    def where(self, *name: str) -> str:
        return self.storage.describe(*name)

    # ------------------------------------------------------------------------------- writing

    def save(self, *, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, optimizer: torch.optim.Optimizer,
             scheduler: Any, scaler: torch.amp.GradScaler, progress: Progress, best: Optional[Evaluation],
             evaluation: Optional[Evaluation], tracker_id: Optional[str],
             rng_ranks: Optional[List[Dict[str, Any]]] = None) -> str:
        """Write a checkpoint of the current step; the manifest goes last, so a crash at any
        point leaves the previous checkpoints as they were. ``rng_ranks``: every process's random
        generators, in rank order, under data parallelism; ``rng`` is always rank 0's (this one's)."""
        name = checkpoint_name(progress.step)
        self.storage.remove(name)  # an unfinished (or damaged) earlier attempt at this step
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "rng": rng_state(),
                 "rng_ranks": rng_ranks or [],
                 "progress": asdict(progress), "best": asdict(best) if best else None,
                 "tracker_id": tracker_id, "identity": self.identity}
        files = {STATE: _serialize(state)}
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.save_pretrained(tmp)
            files.update({f"tokenizer/{p.name}": p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()})
        for file, data in files.items():
            self.storage.write_bytes(f"{name}/{file}", data)
        manifest = {"step": progress.step, "identity": self.identity,
                    "objective": evaluation.objective if evaluation else None,
                    "files": {file: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                              for file, data in files.items()}}
        self.storage.write_text(f"{name}/{MANIFEST}", json.dumps(manifest, indent=1))
        self._prune(best)
        return name

    def _prune(self, best: Optional[Evaluation]) -> None:
        """Keep the newest ``keep`` complete checkpoints and the best one; drop the rest, and
        unfinished saves older than the newest complete checkpoint."""
        complete = self._complete()
        keep = set(complete[-self.keep:])
        if best is not None:
            keep.add(checkpoint_name(best.step))
        newest = _step(complete[-1]) if complete else -1
        for name in self._names():
            finished = name in complete
            if (finished and name not in keep) or (not finished and _step(name) < newest):
                self.storage.remove(name)

    # ------------------------------------------------------------------------------- reading

    def _names(self) -> List[str]:
        return sorted((n for n in self.storage.list("") if _NAME.match(n)), key=_step)

    def _complete(self) -> List[str]:
        return [n for n in self._names() if self.storage.exists(f"{n}/{MANIFEST}")]

    def newest_step(self) -> Optional[int]:
        complete = self._complete()
        return _step(complete[-1]) if complete else None

    def resume(self, tokenizer_dir: Path, *, examples_per_epoch: int) -> Optional[Resumed]:
        """The newest checkpoint that reads back intact, or None if there is none at all.
        A damaged one is reported and skipped; if every one is damaged, that is an error.
        ``examples_per_epoch``: the training split's size (reads older checkpoints' progress)."""
        complete = self._complete()
        for name in reversed(complete):
            try:
                return self._load(name, tokenizer_dir, examples_per_epoch)
            except _Damaged as err:
                log.error("checkpoint %s is damaged: %s; trying the one before it", self.where(name), err)
        if complete:
            raise CheckpointError(f"no intact checkpoint in {self.where()}: every one is damaged (see above). "
                                  "Delete that folder to start the run afresh")
        return None

    def _load(self, name: str, tokenizer_dir: Path, examples_per_epoch: int) -> Resumed:
        manifest = self._manifest(name)
        files = {file: self._verified(name, file, expected) for file, expected in manifest["files"].items()}
        state = torch.load(io.BytesIO(files.pop(STATE)), map_location="cpu", weights_only=True)
        tokenizer_dir.mkdir(parents=True, exist_ok=True)
        for file, data in files.items():
            (tokenizer_dir / Path(file).name).write_bytes(data)
        best = Evaluation(**state["best"]) if state["best"] else None
        progress = Progress.saved(state["progress"], examples_per_epoch=examples_per_epoch)
        return Resumed(name=name, state=state, progress=progress, best=best, tracker_id=state["tracker_id"],
                       tokenizer_dir=tokenizer_dir)

    def _verified(self, name: str, file: str, expected: Dict[str, Any]) -> bytes:
        """The bytes of ``file``, checked against the manifest's size and SHA-256."""
        try:
            data = self.storage.read_bytes(f"{name}/{file}")
        except FileNotFoundError:
            raise _Damaged(f"{file} is missing") from None
        if len(data) != expected["size"]:
            raise _Damaged(f"{file} is truncated ({len(data)} of {expected['size']} bytes)")
        if hashlib.sha256(data).hexdigest() != expected["sha256"]:
            raise _Damaged(f"{file} is corrupt (its SHA-256 does not match the manifest)")
        return data

    def _manifest(self, name: str) -> Dict[str, Any]:
        try:
            manifest = json.loads(self.storage.read_bytes(f"{name}/{MANIFEST}"))
        except (OSError, ValueError) as err:
            raise _Damaged(f"{MANIFEST} cannot be read ({err})") from None
        self._check_identity(manifest.get("identity"), name)
        return manifest

    def check_identity(self, step: int) -> None:
        """Fail, touching nothing, if checkpoint ``step`` belongs to another model or task."""
        try:
            self._manifest(checkpoint_name(step))
        except _Damaged:
            pass  # resume() reports it and falls back to an older checkpoint

    def _check_identity(self, theirs: Any, name: str) -> None:
        if theirs != self.identity:
            theirs = theirs if isinstance(theirs, dict) else {}
            differ = ", ".join(f"{key}: checkpoint {theirs.get(key)!r}, config {value!r}"
                               for key, value in self.identity.items() if theirs.get(key) != value)
            raise CheckpointError(
                f"{self.where(name)} is a checkpoint of another run ({differ}). Nothing was changed. "
                "Give this run its own output_dir (or hydra.run.dir), or delete the old run's folder")

    def load_model_weights(self, name: str) -> Dict[str, torch.Tensor]:
        """The model weights of checkpoint ``name`` (the best one, for the final export)."""
        try:
            data = self._verified(name, STATE, self._manifest(name)["files"][STATE])
        except _Damaged as err:
            raise CheckpointError(f"the best checkpoint, {self.where(name)}, is damaged: {err}. Its weights "
                                  "cannot be exported; start the run afresh in a new output_dir") from None
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)["model"]


class _Damaged(Exception):
    pass


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def _step(name: str) -> int:
    match = _NAME.match(name)
    assert match, name
    return int(match.group(1))


def _serialize(state: Dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()
