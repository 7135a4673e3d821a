"""Runs that survive a micro-batch too big for the device (nli.evaluate.oom): the real train.py, its model made to
raise torch's own out-of-memory error above a chosen batch size (a forward pre-hook the tests install;
there is no GPU here), must halve the micro-batch, train exactly as a run started at the size that fits,
keep that size in its checkpoints for a resumed run, halve evaluation batches too, and stop clearly,
with nothing saved lost, where not even one example fits."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from nli import recipe
from nli.data.loaders import LengthGroups, Loader, release_workers
from nli.errors import OutOfMemory
from nli.evaluate import oom
from nli.evaluate.oom import MicroBatches
from nli.runtime.device import Compute
from nli.runtime.distributed import World
from tests.support.runs import FAST, GLUE_DATA, MEASURED, copy_run, read_results, run_app

ARGS = [*FAST, "hw=cpu"]  # global batches of 32; evaluation in one batch of the 96 examples


class Memory:
    """Room on the pretend device: a training forward pass over more than ``train`` examples, once ``after``
    passes went through, raises torch's out-of-memory error; an evaluation pass over more than ``evaluation``
    examples too. Records each pass's size."""

    def __init__(self, train: Optional[int] = None, evaluation: Optional[int] = None, after: int = 0) -> None:
        self.train, self.evaluation, self.after = train, evaluation, after
        self.seen: Dict[str, List[int]] = {"train": [], "eval": []}

    def check(self, module: torch.nn.Module, args: Any, kwargs: Dict[str, Any]) -> None:
        size = len(kwargs["input_ids"])
        mode = "train" if module.training else "eval"
        limit = self.train if module.training else self.evaluation
        passed = len(self.seen["train"]) >= self.after or not module.training
        self.seen[mode].append(size)
        if limit is not None and size > limit and passed:
            raise torch.OutOfMemoryError(f"CUDA out of memory (pretend: {size} examples, room for {limit})")

    @contextlib.contextmanager
    def installed(self) -> Iterator["Memory"]:
        """On the model every run of this process builds or, evaluating a trained one, loads (not the model
        a training run exports and reloads at its end)."""
        build, load_trained = recipe.build, recipe.load_trained

        def limited(*args: Any, **kwargs: Any) -> torch.nn.Module:
            model = build(*args, **kwargs)
            model.register_forward_pre_hook(self.check, with_kwargs=True)
            return model

        def loaded(*args: Any, **kwargs: Any) -> torch.nn.Module:
            model = load_trained(*args, **kwargs)
            model.register_forward_pre_hook(self.check, with_kwargs=True)
            return model

        recipe.build, recipe.load_trained = limited, loaded  # type: ignore[assignment]
        try:
            yield self
        finally:
            recipe.build, recipe.load_trained = build, load_trained  # type: ignore[assignment]


def train(run_dir: Path, *args: str, memory: Optional[Memory] = None, micro_batch: int = 16) -> Any:
    with (memory or Memory()).installed():
        return run_app([*ARGS, f"hw.per_device_batch_size={micro_batch}", *args, f"hydra.run.dir={run_dir}"],
                       cwd=run_dir.parent)


@pytest.fixture(scope="module")
def backed_off(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """A run whose second micro-batch of 16 runs out of memory (the first went through: its dropout drew, its
    gradients are there), and whose evaluation of 96 examples runs out of memory above 40: its folder, log
    and the sizes it ran."""
    memory = Memory(train=8, evaluation=40, after=1)
    folder = tmp_path_factory.mktemp("oom") / "backed-off"
    proc = train(folder, memory=memory)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"folder": folder, "log": proc.stdout + proc.stderr, "seen": memory.seen}


@pytest.fixture(scope="module")
def started_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run configured from the start with the sizes that fit."""
    folder = tmp_path_factory.mktemp("oom") / "started-small"
    proc = train(folder, "train.eval_batch_size=32", micro_batch=8)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder


def manifests(run_dir: Path) -> Dict[str, Dict[str, Any]]:
    """Each checkpoint's manifest, less its files' sizes and digests and its run's folder."""
    return {p.parent.name: {k: v for k, v in json.loads(p.read_text()).items()
                            if k not in ("files", "identity", "output_dir")}
            for p in sorted((run_dir / "checkpoints").glob("step-*/checkpoint.json"))}


def saved_part(run_dir: Path, step: int, part: str) -> Any:
    state = torch.load(io.BytesIO((run_dir / "checkpoints" / f"step-{step:06d}" / "state.pt").read_bytes()),
                       weights_only=True)
    return state["parts"][part]


def test_out_of_memory_halves_the_micro_batch_and_trains_as_a_run_started_at_that_size(
        backed_off: Dict[str, Any], started_small: Path) -> None:
    """The step that ran out of memory is undone (the first micro-batch's gradients and dropout draws with
    it) and done again in micro-batches of 8: bit for bit the training of a run started at 8, since every
    step then runs the same operations on the same numbers. Its evaluations, halved to batches of 32, give
    the same metrics."""
    folder, log = backed_off["folder"], backed_off["log"]
    assert ("out of GPU memory in a micro-batch of 16 examples: going on in micro-batches of 8, 4 accumulated per "
            "optimizer step, the same global batch of 32 in the same order, so the same training "
            "(hw.per_device_batch_size=8 starts there; the checkpoints keep it)") in log
    assert ("out of GPU memory evaluating batches of 128 examples: evaluating in batches of 64 from now on, with the "
            "same metrics (train.eval_batch_size=64 starts there)") in log
    assert "evaluating batches of 64 examples: evaluating in batches of 32" in log
    assert backed_off["seen"]["train"][:3] == [16, 16, 8] and set(backed_off["seen"]["train"][3:]) == {8}
    assert backed_off["seen"]["eval"][:2] == [96, 64] and set(backed_off["seen"]["eval"][2:]) == {32}
    ours, theirs = read_results(folder), read_results(started_small)
    assert {k: v for k, v in ours.items() if k not in MEASURED} == \
        {k: v for k, v in theirs.items() if k not in MEASURED}
    assert manifests(folder) == manifests(started_small)  # every evaluation's metrics, step by step
    weights = load_file(folder / "model" / "model.safetensors")
    expected = load_file(started_small / "model" / "model.safetensors")
    assert weights.keys() == expected.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, expected[name]), name
    assert saved_part(folder, 12, "micro_batches") == {"configured": 16, "size": 8}


RTE = ["task=rte", f"data.dir={GLUE_DATA}", "model=tiny", "data.max_seq_length=64", "train.batch_size=16",
       "train.max_steps=2", "train.eval_every=2", "train.progress_bar=false", "hw=cpu", "train.predict=true"]


def test_an_evaluation_only_run_and_its_test_predictions_back_off_too(tmp_path: Path) -> None:
    """eval.only of a run folder, in batches of 128 where only 40 examples fit: its evaluation halves to 32,
    its test split's predictions (1,384 pairs) start there, and the metrics, the dev predictions and the
    submission file are those of the same evaluation asked in batches of 32."""
    trained = tmp_path / "trained"
    proc = run_app([*RTE, f"hydra.run.dir={trained}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    evaluate = ["eval.only=true", f"model.name_or_path={trained}", "train.predict=true", "train.progress_bar=false",
                "hw=cpu"]
    memory = Memory(evaluation=40)
    with memory.installed():
        backed = run_app([*evaluate, f"hydra.run.dir={tmp_path / 'backed-off'}"], cwd=tmp_path)
    assert backed.returncode == 0, backed.stdout + backed.stderr
    small = run_app([*evaluate, "train.eval_batch_size=32", f"hydra.run.dir={tmp_path / 'small'}"], cwd=tmp_path)
    assert small.returncode == 0, small.stdout + small.stderr
    log = backed.stdout + backed.stderr
    assert "out of GPU memory evaluating batches of 128 examples: evaluating in batches of 64 from now on" in log
    assert "predicting in batches" not in log  # no batch too big tried again
    assert max(memory.seen["eval"][-40:]) == 32  # the test split, at the size that fits
    ours, theirs = (read_results(tmp_path / name) for name in ("backed-off", "small"))
    assert {k: v for k, v in ours.items() if k not in {*MEASURED, "identity"}} == \
        {k: v for k, v in theirs.items() if k not in {*MEASURED, "identity"}}
    for name in ("predictions/RTE.tsv", "eval_predictions/validation.jsonl"):
        assert (tmp_path / "backed-off" / name).read_text() == (tmp_path / "small" / name).read_text(), name


def test_predictions_out_of_memory_go_on_in_halved_batches_and_say_the_size_that_fit(
        caplog: pytest.LogCaptureFixture) -> None:
    """oom.fitting, on a real loader: a pass over batches above 20 examples runs out of memory."""
    seen: List[int] = []

    def predict(loader: DataLoader) -> List[int]:
        predicted: List[int] = []
        for batch in loader:
            seen.append(len(batch))
            if len(batch) > 20:
                raise torch.OutOfMemoryError("CUDA out of memory (pretend)")
            predicted += batch.tolist()
        return predicted

    cpu = Compute(device=torch.device("cpu"), dtype=torch.float32)
    predicted, size = oom.fitting(predict, oom.at_most(DataLoader(list(range(100)), batch_size=128), 64), cpu,
                                  World())
    assert predicted == list(range(100)) and size == 16 and seen[:3] == [64, 32, 16]
    assert "out of GPU memory predicting in batches of 64 examples: predicting in batches of 32" in caplog.text
    with pytest.raises(OutOfMemory, match="rank 1 of 2 ran out of GPU memory predicting batches of 64 examples"):
        oom.fitting(predict, DataLoader(list(range(100)), batch_size=64), cpu, World(rank=1, world_size=2))


@pytest.mark.parametrize("asked,runs_at", [(16, 8), (32, 32)])
def test_a_resumed_run_starts_at_the_size_that_fit_unless_the_size_asked_changed(
        backed_off: Dict[str, Any], tmp_path: Path, asked: int, runs_at: int) -> None:
    """Continued from its checkpoint (on a device with room to spare here), the run goes on in the micro-batches
    that fit; asked for another hw.per_device_batch_size (a bigger GPU, say), it takes that one."""
    run_dir = copy_run(backed_off["folder"], tmp_path / "run")
    memory = Memory()
    proc = train(run_dir, "train.max_steps=18", "train.accept_changes=[train.max_steps]", memory=memory,
                 micro_batch=asked)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(memory.seen["train"]) == {runs_at}
    kept = "micro-batches of 8, the size that fit when the run ran out of memory in micro-batches of 16"
    assert (kept in proc.stdout) == (runs_at == 8)
    assert saved_part(run_dir, 18, "micro_batches") == {"configured": asked, "size": runs_at}


def test_not_even_one_example_fitting_stops_with_the_setting_named_and_keeps_the_checkpoints(
        backed_off: Dict[str, Any], tmp_path: Path) -> None:
    run_dir = copy_run(backed_off["folder"], tmp_path / "run")
    before = manifests(run_dir)
    proc = train(run_dir, "train.max_steps=18", "train.accept_changes=[train.max_steps]", memory=Memory(train=0))
    assert proc.returncode == 1
    assert ("out of GPU memory with a single example per micro-batch: no hw.per_device_batch_size fits. The run "
            "stopped, its checkpoints kept") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert manifests(run_dir) == before and read_results(run_dir)["train_steps"] == 12
    again = train(run_dir, "train.max_steps=18", "train.accept_changes=[train.max_steps]")
    assert again.returncode == 0 and read_results(run_dir)["train_steps"] == 18


def test_under_data_parallelism_a_rank_out_of_memory_stops_with_the_size_to_set() -> None:
    """The other ranks wait in the gradient all-reduce: a rank cannot cut its step alone, so it stops, its
    message naming the setting (torchrun then ends the others)."""
    sizes = MicroBatches(16, Compute(device=torch.device("cpu"), dtype=torch.float32), World(rank=1, world_size=2))
    loader = torch.utils.data.DataLoader(list(range(64)), batch_size=16)
    with pytest.raises(OutOfMemory, match=re.escape("rank 1 of 2 ran out of GPU memory in a micro-batch of 16 "
                                                    "examples") + ".*Set hw.per_device_batch_size=8 and start it "
                                                                  "again: it resumes from its newest checkpoint"):
        sizes.back_off(loader, torch.nn.Linear(1, 1), global_batch=64)


@pytest.mark.parametrize("grouped", [False, True], ids=["training", "evaluation"])
def test_a_loader_replaced_by_smaller_batches_ends_the_workers_it_kept(grouped: bool) -> None:
    """On a GPU, loaders keep their workers between passes (persistent_workers). One replaced after an out-of-memory
    error is read no more, but the run's data holds it to the end: its workers end as it is replaced, and the
    smaller batches keep workers of their own (an evaluation's length groups too, which forked them again at each
    evaluation). The data is the same, in the same order."""
    data = list(range(64))
    batching = (dict(batch_sampler=LengthGroups([n % 7 for n in data], 16)) if grouped else dict(batch_size=16))
    loader = Loader(data, **batching, num_workers=1, persistent_workers=True)  # type: ignore[arg-type]
    before = set(multiprocessing.active_children())
    first = [batch.tolist() for batch in loader]
    kept = set(multiprocessing.active_children()) - before
    assert len(kept) == 1 and all(worker.is_alive() for worker in kept)
    if grouped:
        smaller = oom.rebatched(loader, 8)
    else:
        sizes = MicroBatches(16, Compute(device=torch.device("cpu"), dtype=torch.float32), World())
        smaller = sizes.back_off(loader, torch.nn.Linear(1, 1), global_batch=64)
    for worker in kept:
        worker.join(10)
    assert not any(worker.is_alive() for worker in kept)
    assert smaller.persistent_workers and smaller.num_workers == 1
    halves = [batch.tolist() for batch in smaller]
    assert [len(batch) for batch in halves] == [8] * 8 and sum(halves, []) == sum(first, [])
    release_workers(smaller)


@pytest.mark.parametrize("size, per_device, smaller", [(16, 32, 8), (12, 24, 6), (7, 28, 2), (9, 36, 4), (3, 24, 1),
                                                       (6, 6, 3), (1, 24, None)])
def test_a_micro_batch_backs_off_to_about_half_a_size_that_still_divides_the_devices_batch(
        size: int, per_device: int, smaller: int | None) -> None:
    """An odd micro-batch does not fall to one example (7 of 28: 2, not 1); every size divides the device's
    share of the global batch, so that the micro-batches add up to it."""
    assert oom._half(size, per_device) == smaller


class OptimizerMemory:
    """The optimizer's first ``failures`` steps raise torch's out-of-memory error before they allocate anything,
    as a fused optimizer's step does when its state does not fit (a step pre-hook on the run's optimizer)."""

    def __init__(self, failures: int) -> None:
        self.failures, self.steps = failures, 0

    def check(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if self.steps <= self.failures:
            raise torch.OutOfMemoryError("CUDA out of memory (pretend: the optimizer's moments)")

    @contextlib.contextmanager
    def installed(self) -> Iterator["OptimizerMemory"]:
        build = recipe.build_optimizer

        def limited(*args: Any, **kwargs: Any) -> torch.optim.Optimizer:
            optimizer = build(*args, **kwargs)
            optimizer.register_step_pre_hook(self.check)
            return optimizer

        recipe.build_optimizer = limited  # type: ignore[assignment]
        try:
            yield self
        finally:
            recipe.build_optimizer = build  # type: ignore[assignment]


def test_out_of_memory_in_the_optimizers_first_step_tries_again_and_trains_as_if_it_fit(
        tmp_path: Path, shared_run: Any) -> None:
    """Adam's moments are allocated in the first step, after the backward pass: an out-of-memory error there
    escaped the back-off. The step is tried again once, its state dropped and the memory freed, and the run ends
    as one that fit at once."""
    with OptimizerMemory(failures=1).installed() as memory:
        proc = train(tmp_path / "run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "out of GPU memory allocating the optimizer's state in its first step: trying once more" in proc.stdout
    assert memory.steps == 13  # the 12 steps, the first twice
    expected = read_results(shared_run("oom-reference", [*ARGS, "hw.per_device_batch_size=16"]))
    assert {k: v for k, v in read_results(tmp_path / "run").items() if k not in MEASURED} == \
        {k: v for k, v in expected.items() if k not in MEASURED}


def test_an_optimizer_that_does_not_fit_stops_in_one_line(tmp_path: Path) -> None:
    with OptimizerMemory(failures=2).installed():
        proc = train(tmp_path / "run")
    assert proc.returncode == 1
    assert ("out of GPU memory in the optimizer's step: its state" in proc.stderr and
            "The run stopped, its checkpoints kept" in proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_fp16_first_step_tried_again_unscales_its_gradients_once() -> None:
    """A fused optimizer's step is told the loss scale by GradScaler (``optimizer.grad_scale``), which only a step
    that ends deletes: the retry after an out-of-memory error found the failed step's and multiplied it in, so the
    first update saw gradients 2^16 times too small. The retried step is the step that would have been."""

    def stepped(failures: int) -> torch.Tensor:
        torch.manual_seed(0)
        weight = torch.nn.Parameter(torch.randn(64))
        optimizer = torch.optim.AdamW([weight], lr=0.1, fused=True)
        memory = OptimizerMemory(failures=failures)
        optimizer.register_step_pre_hook(memory.check)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
        scaler.scale((weight * torch.linspace(-1e-3, 1e-3, 64)).sum()).backward()
        oom.optimizer_step(optimizer, scaler, Compute(torch.device("cpu"), torch.float16))
        assert memory.steps == failures + 1 and not hasattr(optimizer, "grad_scale")
        return weight.detach()

    assert torch.equal(stepped(failures=1), stepped(failures=0))
