"""What a checkpoint holds (nli/train/checkpoint.py): the registry saves and restores every part in order and
refuses a missing one unless it is optional; each rank's random generators, restored on any number of GPUs; the
state written as torch serializes it, its manifest vouching for it."""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest
import torch
import transformers

from nli.errors import CheckpointError
from nli.evaluate.evaluation import Evaluation
from nli.io.storage import Storage
from nli.train.checkpoint import (
    FORMAT,
    MANIFEST,
    STATE,
    BestEvaluation,
    Checkpoints,
    Progress,
    TrainingState,
    seed_everything,
)


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> Dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.count = state["count"]


def test_the_registry_saves_and_restores_every_part_in_order() -> None:
    model, progress, best, extra = torch.nn.Linear(2, 2), Progress(step=7), BestEvaluation(), Counter()
    best.update(Evaluation(step=6, metrics={"accuracy": 0.5}, objective=0.5))
    extra.count = 3
    state = TrainingState()
    for name, part in (("model", model), ("progress", progress), ("best", best)):
        state.register(name, part)
    state.register("extra", extra)  # a new part is one line
    saved = state.state_dict()
    assert list(saved) == ["model", "progress", "best", "extra"]

    fresh_model, fresh_progress = torch.nn.Linear(2, 2), Progress()
    fresh_best, fresh_extra = BestEvaluation(), Counter()
    restored = TrainingState()
    for name, part in (("model", fresh_model), ("progress", fresh_progress), ("best", fresh_best),
                       ("extra", fresh_extra)):
        restored.register(name, part)
    restored.load_state_dict(saved)
    assert torch.equal(fresh_model.weight, model.weight) and fresh_progress.step == 7 and fresh_extra.count == 3
    assert fresh_best.evaluation == best.evaluation


def test_a_missing_part_is_an_error_unless_it_is_optional() -> None:
    state = TrainingState()
    state.register("progress", Progress())
    state.register("extra", Counter())
    with pytest.raises(CheckpointError, match="holds no state for extra"):
        state.load_state_dict({"progress": Progress(step=2).state_dict()})
    lenient = TrainingState()
    lenient.register("progress", progress := Progress())
    lenient.register("extra", extra := Counter(), optional=True)  # switched on after the checkpoint was written
    extra.count = 5
    lenient.load_state_dict({"progress": Progress(step=2).state_dict()})
    assert progress.step == 2 and extra.count == 5


# ------------------------------------------------------------------- random generators, any GPU count


class VisibleGpus:
    """The generators of the GPUs a process sees, as torch.cuda keeps them: one per GPU, indexed by its number
    (torch.cuda.default_generators[i]), which fails past the last. The CPU has none to test with."""

    def __init__(self, count: int, current: int = 0) -> None:
        self.states = {i: torch.tensor([i], dtype=torch.uint8) for i in range(count)}
        self.current = current

    def set_rng_state(self, state: torch.Tensor, device: Any = "cuda") -> None:
        index = self.current if device == "cuda" else int(device)
        if index not in self.states:
            raise IndexError(f"tuple index out of range (no GPU {index} among {len(self.states)})")
        self.states[index] = state

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.states))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": self.states[int(device)])
        for module in (torch.cuda, torch.cuda.random):  # set_rng_state_all calls the module's own name
            monkeypatch.setattr(module, "set_rng_state", self.set_rng_state)


def test_each_rank_saves_its_own_gpus_generator_and_one_gpu_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from nli.train.checkpoint import restore_rng, rng_state

    rank3 = VisibleGpus(count=8, current=3)  # rank 3 of a node whose 8 GPUs every rank sees
    rank3.install(monkeypatch)
    saved = rng_state()
    assert torch.equal(saved["cuda"], torch.tensor([3], dtype=torch.uint8))  # its own GPU's, not all eight
    alone = VisibleGpus(count=1)
    alone.install(monkeypatch)
    restore_rng(saved)
    assert torch.equal(alone.states[0], saved["cuda"])


def test_a_checkpoint_written_seeing_eight_gpus_resumes_on_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints of earlier versions hold every visible GPU's state; restored where fewer are seen, each GPU
    takes its own (set_rng_state_all indexed GPUs that are not there: IndexError on the first step)."""
    from nli.train.checkpoint import restore_rng, rng_state

    VisibleGpus(count=1).install(monkeypatch)
    state = rng_state()
    state["cuda"] = [torch.tensor([10 + i], dtype=torch.uint8) for i in range(8)]
    alone = VisibleGpus(count=1)
    alone.install(monkeypatch)
    restore_rng(state)
    assert torch.equal(alone.states[0], torch.tensor([10], dtype=torch.uint8))


def test_a_gpu_checkpoint_resumes_on_the_cpu_with_its_cpu_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    from nli.train.checkpoint import restore_rng, rng_state

    state = rng_state()  # this machine's: no GPU
    expected = torch.rand(4)
    torch.set_rng_state(state["torch"])
    state["cuda"] = torch.tensor([7], dtype=torch.uint8)  # as a GPU run saved it
    torch.rand(3)
    restore_rng(state)
    assert torch.equal(torch.rand(4), expected)


def test_seed_everything_draws_what_transformers_set_seed_draws() -> None:
    """Runs seed Python, NumPy and torch themselves (transformers.set_seed imports its Trainer's utilities and
    peft: seconds of every start): the same draws, so that runs started before keep their results."""
    def draws() -> tuple:
        return random.random(), float(np.random.rand()), torch.rand(3).tolist(), torch.randint(0, 10**6, (2,)).tolist()

    for seed in (0, 42, 2**32 - 1):
        transformers.set_seed(seed)
        theirs = draws()
        seed_everything(seed)
        assert draws() == theirs


def test_the_state_is_written_as_torch_serializes_it_and_the_manifest_vouches_for_it(tmp_path: Path) -> None:
    """The state goes straight into its file, hashed on the way (no copy of it in memory): the same bytes
    torch.save makes, the manifest's size and SHA-256 those of the file, read back and verified whole."""
    torch.manual_seed(0)
    parts = {"model": {"weight": torch.randn(300, 70), "bias": torch.zeros(70, dtype=torch.bfloat16)},
             "progress": {"step": 5}}
    checkpoints = Checkpoints(Storage(str(tmp_path)), keep=2, identity={"digest": "abc"})
    checkpoints.write(5, {"format": FORMAT, "parts": parts}, {"tokenizer/vocab.txt": b"[PAD]\n"}, evaluation=None)
    written = (tmp_path / "step-000005" / STATE).read_bytes()
    expected = io.BytesIO()
    torch.save({"format": FORMAT, "parts": parts}, expected)
    assert written == expected.getvalue()
    manifest = json.loads((tmp_path / "step-000005" / MANIFEST).read_text())
    assert manifest["files"][STATE] == {"size": len(written), "sha256": hashlib.sha256(written).hexdigest()}
    assert list(manifest["files"]) == [STATE, "tokenizer/vocab.txt"]
    snapshot = checkpoints.snapshot(5)
    assert torch.equal(snapshot.state["model"]["weight"], parts["model"]["weight"])
    assert snapshot.tokenizer_files == {"vocab.txt": b"[PAD]\n"}


class Interrupted(io.BytesIO):
    """A file whose second write is interrupted (Ctrl-C)."""

    def write(self, data: Any) -> int:
        if self.tell():
            raise KeyboardInterrupt
        return super().write(data)


def test_what_stops_the_states_write_is_raised_as_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's writer turns whatever a write raises into its own RuntimeError ("unexpected pos"): the
    interrupt, or the storage's error for a full disk (tests/runs/test_resume.py), is raised instead."""
    storage = Storage(str(tmp_path))
    monkeypatch.setattr(storage, "write_stream", lambda name, write: write(Interrupted()))
    with pytest.raises(KeyboardInterrupt):
        Checkpoints(storage, keep=2, identity={}).write(5, {"format": FORMAT, "parts": {"w": torch.zeros(4096)}}, {},
                                                        evaluation=None)
    assert not (tmp_path / "step-000005" / MANIFEST).exists()


def damaged(folder: Storage, file: str, how: str) -> None:
    data = folder.read_bytes(f"step-000005/{file}")
    if how == "missing":
        folder.remove(f"step-000005/{file}")
    else:
        flipped = data[:-1] + bytes([data[-1] ^ 1])  # the same size, one bit off
        folder.write_bytes(f"step-000005/{file}", data[:len(data) // 2] if how == "truncated" else flipped)


@pytest.mark.parametrize("file", [STATE, "tokenizer/vocab.txt"])
def test_a_checkpoint_read_back_is_checked_piece_by_piece_and_its_damage_named(folder: Storage, file: str) -> None:
    """The state is hashed in pieces from its file (on Cloud Storage, a download of it: ``folder``, from
    tests/nli/conftest.py), then loaded from it: never held whole in memory twice. Each kind of damage is
    named, for the state and for a tokenizer file alike."""
    weight = torch.randn(700, 300)
    checkpoints = Checkpoints(folder, keep=2, identity={})
    tokenizer = {"tokenizer/vocab.txt": b"[PAD]\n"}
    checkpoints.write(5, {"format": FORMAT, "parts": {"model": {"weight": weight}}}, tokenizer, evaluation=None)
    assert checkpoints.damage(5) is None
    assert torch.equal(checkpoints.load_model_weights(5)["weight"], weight)
    snapshot = checkpoints.snapshot(5)
    assert torch.equal(snapshot.state["model"]["weight"], weight)
    assert snapshot.tokenizer_files == {"vocab.txt": b"[PAD]\n"}
    size = len(folder.read_bytes(f"step-000005/{file}"))
    for how, said in [("truncated", f"{file} is truncated ({size // 2} of {size} bytes)"),
                      ("corrupt", f"{file} is corrupt (its SHA-256 does not match the manifest)"),
                      ("missing", f"{file} is missing")]:
        original = folder.read_bytes(f"step-000005/{file}")
        damaged(folder, file, how)
        assert checkpoints.damage(5) == said, how
        with pytest.raises(CheckpointError, match=re.escape(said)):
            checkpoints.snapshot(5)
        folder.write_bytes(f"step-000005/{file}", original)
    assert checkpoints.damage(5) is None


@pytest.mark.parametrize("written", ["[]", "null"])
def test_a_manifest_that_is_json_but_not_an_object_is_damage_named_not_a_crash(tmp_path: Path, written: str) -> None:
    """A checkpoint.json overwritten with JSON that is not a manifest stopped every command on the folder with an
    AttributeError's traceback ('list' object has no attribute 'get'), where a damaged manifest is named and the
    checkpoint before it used."""
    checkpoints = Checkpoints(Storage(str(tmp_path)), keep=2, identity={})
    for step in (5, 10):
        checkpoints.write(step, {"format": FORMAT, "parts": {"model": {"weight": torch.full((3,), float(step))}}}, {},
                          evaluation=None)
    (tmp_path / "step-000010" / MANIFEST).write_text(written)
    assert checkpoints.damage(10) == f"{MANIFEST} is not a manifest (JSON, but not an object)"
    assert checkpoints.newest_recorded_step() == 5 and checkpoints.identity_of(10) is None
    latest = checkpoints.latest()
    assert latest is not None and latest.step == 5
