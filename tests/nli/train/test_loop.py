"""The training loop on its own (nli.train.loop.Loop), on a model small enough that every step can be worked
out by hand: gradient accumulation and the epoch's short last batch, the skip of a non-finite loss,
early stopping, the checkpoint cadence, a stop at a step boundary, and a resume that ends where an
uninterrupted loop does. Milliseconds each: a loop bug shows here before any end-to-end run."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import pytest
import torch
from torch.utils.data import DataLoader
from transformers.modeling_outputs import SequenceClassifierOutput

from nli.config.schema import TrainConfig
from nli.data.loaders import EpochSampler, TrainBatches
from nli.errors import Diverged
from nli.evaluate.evaluation import Evaluation
from nli.io.claim import Claim, ClaimLostError
from nli.io.storage import Storage
from nli.model.build import train_bpe_tokenizer
from nli.runtime.device import Compute
from nli.runtime.distributed import World, wrap
from nli.runtime.signals import Preempted, StopRequest
from nli.train.checkpoint import (
    CHECKPOINTS_CLAIM,
    BestEvaluation,
    Checkpointer,
    Checkpoints,
    Progress,
    RandomState,
    TrainingState,
)
from nli.train.hooks import EarlyStopping, Hook, Pruning
from nli.train.loop import Loop, Optimization, Plan, Scaler, TrainResult

FEATURES, CLASSES = 4, 3


class Classifier(torch.nn.Module):
    """A linear classifier that takes a batch as the encoders do (its inputs and ``labels`` by name)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(FEATURES, CLASSES)

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> SequenceClassifierOutput:
        logits = self.linear(features)
        return SequenceClassifierOutput(loss=torch.nn.functional.cross_entropy(logits, labels), logits=logits)


def examples(size: int, *, poison: Sequence[int] = ()) -> List[Dict[str, torch.Tensor]]:
    """``size`` examples drawn from a fixed generator; those in ``poison`` have a NaN feature."""
    generator = torch.Generator().manual_seed(size)
    features = torch.randn(size, FEATURES, generator=generator)
    features[list(poison), 0] = math.nan
    labels = torch.randint(0, CLASSES, (size,), generator=generator)
    return [{"features": features[i], "labels": labels[i]} for i in range(size)]


@pytest.fixture(scope="module")
def tokenizer() -> object:
    """What a checkpoint saves beside the weights: a real (tiny) tokenizer."""
    return train_bpe_tokenizer(["a premise", "a hypothesis"], vocab_size=300, max_seq_length=16)


@dataclass
class Trial:
    """One loop over ``data`` and what it was made of, to run and to inspect."""

    data: List[Dict[str, torch.Tensor]]
    train: TrainConfig
    folder: Path
    tokenizer: object
    micro_batch: int = 32
    objectives: Sequence[float] = ()  # what each evaluation reports, in turn; empty: the loss on all the data
    hooks: List[Hook] = field(default_factory=list)
    scaled: bool = False  # the loss scaled as under fp16 (GradScaler), the gradients unscaled before the step
    fp16: bool = False  # computed in fp16 (autocast), the loss scaled from init_scale
    init_scale: float = 2.0**16  # GradScaler's default
    # Non-finite steps skipped by the scaler on the device, as on a GPU (nli.train.loop.grad_scaler).
    on_device: bool = False
    adam: bool = False  # fused AdamW, the default optimizer, instead of SGD
    ddp: bool = False  # the model in DDP as the run wraps it (nli.runtime.distributed.wrap): a process group needed
    model: Classifier = field(init=False)
    progress: Progress = field(default_factory=Progress)
    best: BestEvaluation = field(default_factory=BestEvaluation)
    evaluated: List[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        torch.manual_seed(0)
        self.model = Classifier()
        self.optimizer = (torch.optim.AdamW(self.model.parameters(), lr=0.1, fused=True) if self.adam else
                          torch.optim.SGD(self.model.parameters(), lr=0.5))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0 / (1 + step))
        # The scalers nli.train.loop.grad_scaler makes: a GPU's outside fp16, else fp16's (or none).
        self.scaler = (torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=2**30) if self.on_device else
                       torch.amp.GradScaler("cpu", init_scale=self.init_scale, enabled=self.scaled or self.fp16))
        self.state = TrainingState()
        for name, part in (("model", self.model), ("optimizer", self.optimizer), ("scheduler", self.scheduler),
                           ("scaler", Scaler(self.scaler)), ("progress", self.progress), ("best", self.best)):
            self.state.register(name, part)
        self.state.register("rng", RandomState(World(), self.progress))
        self.checkpoints = Checkpoints(Storage(str(self.folder)), keep=self.train.keep_checkpoints, identity={})

    def loop(self) -> Loop:
        dtype = torch.float16 if self.fp16 else torch.float32
        world, compute = World(), Compute(device=torch.device("cpu"), dtype=dtype)
        sampler = EpochSampler(len(self.data), seed=1, batch_size=self.train.batch_size)
        loader = DataLoader(self.data, batch_size=self.micro_batch, sampler=sampler)
        plan = Plan.make(self.train, examples_per_epoch=len(self.data), world_size=1,
                         accumulation=math.ceil(self.train.batch_size / self.micro_batch))
        trained = wrap(self.model, World(world_size=2), compute.device) if self.ddp else self.model
        opt = Optimization(self.model, trained, self.optimizer, self.scheduler, self.scaler, compute, world,
                           skips_on_device=self.on_device)
        checkpointer = Checkpointer(self.checkpoints, self.state, self.tokenizer, world)  # type: ignore[arg-type]
        return Loop(opt, TrainBatches(loader, sampler), plan, evaluate=self.evaluate, checkpointer=checkpointer,
                    hooks=self.hooks)

    def evaluate(self, model: torch.nn.Module, step: int) -> Evaluation:
        self.evaluated.append(step)
        if self.objectives:
            objective = self.objectives[len(self.evaluated) - 1]
        else:
            batch = torch.utils.data.default_collate(self.data)
            with torch.no_grad():
                objective = -float(model(**batch).loss)
        return Evaluation(step=step, metrics={"accuracy": objective}, objective=objective)

    def run(self, stop: Optional[StopRequest] = None) -> TrainResult:
        with (stop or StopRequest()) as request, request.at_step_boundaries():
            return self.loop().run(self.progress, self.best, request)

    def saved_steps(self) -> List[int]:
        return [int(p.name[5:]) for p in sorted(self.folder.glob("step-*")) if (p / "checkpoint.json").exists()]


def config(**settings: object) -> TrainConfig:
    return TrainConfig(**{"batch_size": 32, "log_every": 1, "progress_bar": False, **settings})  # type: ignore[arg-type]


def by_hand(data: List[Dict[str, torch.Tensor]], *, steps: int, batch_size: int, max_grad_norm: Optional[float] = 1.0,
            norms: Optional[List[float]] = None) -> Dict[str, torch.Tensor]:
    """The weights plain SGD reaches with the mean loss of each global batch, in the sampler's order, at the
    loop's learning rates: what any cut into micro-batches must reach too. ``norms`` gets each step's
    gradient norm, before clipping to ``max_grad_norm`` (None: no clipping)."""
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    sampler = EpochSampler(len(data), seed=1, batch_size=batch_size)
    order: List[int] = []
    epoch = 0
    while len(order) < steps * batch_size + len(data):
        sampler.set_epoch(epoch)
        order += [*sampler]
        epoch += 1
    done = 0
    for _ in range(steps):
        start = done % len(data)
        size = min(batch_size, len(data) - start)
        batch = torch.utils.data.default_collate([data[i] for i in order[done:done + size]])
        model(**batch).loss.backward()
        if norms is not None:
            norms.append(float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))))
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step(), scheduler.step(), optimizer.zero_grad()
        done += size
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@pytest.mark.parametrize("micro_batch", [32, 16, 8])
def test_micro_batches_add_up_to_the_global_batch_and_the_last_short_one_counts_its_examples(
        micro_batch: int, tmp_path: Path, tokenizer: object) -> None:
    """56 examples in global batches of 32: steps of 32 and 24. Cut into micro-batches of 16 or 8, the steps
    reach the weights of one batch at a time; the short one's micro-batches (16 and 8) weigh by their
    examples."""
    data = examples(56)
    trial = Trial(data, config(max_steps=5, eval_every=100), tmp_path, tokenizer, micro_batch=micro_batch)
    result = trial.run()
    assert result.steps == 5 and result.examples == 32 + 24 + 32 + 24 + 32
    expected = by_hand(data, steps=5, batch_size=32)
    for name, tensor in trial.model.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-7, msg=name)
    assert trial.progress.epoch == 2 and trial.progress.examples_in_epoch == 32


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    """A gloo process group of this process alone: DDP's reducer and its hooks run as with more."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_under_ddp_accumulated_gradients_stay_in_its_buckets_from_the_first_step(
        process_group: None, tmp_path: Path, tokenizer: object) -> None:
    """DDP's gradients are views into its all-reduce buckets (gradient_as_bucket_view): a gradient that was None
    as DDP was built, or set to None between steps, came back in each micro-batch that only accumulates (no_sync)
    as a tensor of its own beside the buckets: a whole gradient more at the step's peak. The loop trains as
    without DDP, bit for bit."""
    seen: List[int] = []  # at each micro-batch's forward pass, the storages the gradients so far are in

    def storages(module: torch.nn.Module, args: object) -> None:
        grads = [param.grad for param in module.parameters() if param.grad is not None]
        seen.append(len({grad.untyped_storage().data_ptr() for grad in grads}))

    data = examples(64)
    in_ddp = Trial(data, config(max_steps=3, eval_every=100), tmp_path / "ddp", tokenizer, micro_batch=8, adam=True,
                   ddp=True)
    in_ddp.model.register_forward_pre_hook(storages)
    in_ddp.run()
    assert len(seen) >= 12 and set(seen) == {1}, seen  # 4 micro-batches a step, the last evaluation; one bucket
    alone = Trial(data, config(max_steps=3, eval_every=100), tmp_path / "alone", tokenizer, micro_batch=8, adam=True)
    alone.run()
    for name, tensor in alone.model.state_dict().items():
        assert torch.equal(tensor, in_ddp.model.state_dict()[name]), name


@pytest.mark.parametrize("scaled", [False, True], ids=["", "loss-scaled"])
@pytest.mark.parametrize("max_grad_norm", [0.25, None], ids=["clipped", "not-clipped"])
def test_the_gradient_norm_is_logged_before_clipping_and_logging_it_changes_no_weight(
        max_grad_norm: Optional[float], scaled: bool, tmp_path: Path, tokenizer: object) -> None:
    """Each logged step's gradient norm is the norm of that step's gradient before any clipping, clipped
    or not, and under fp16's loss scaling of the unscaled gradient; a loop that logs (and so measures) it
    every step ends with the weights, bit for bit, of one that logs it once."""
    data, norms = examples(56), []
    expected = by_hand(data, steps=6, batch_size=32, max_grad_norm=max_grad_norm, norms=norms)
    logged = Logged()
    every = Trial(data, config(max_steps=6, eval_every=100, max_grad_norm=max_grad_norm), tmp_path / "every",
                  tokenizer, micro_batch=16, hooks=[logged], scaled=scaled)
    every.run()
    assert [row[0] for row in logged.rows] == [1, 2, 3, 4, 5, 6]
    assert [row[4] for row in logged.rows] == pytest.approx(norms, rel=1e-5)
    assert max_grad_norm is None or max(norms) > max_grad_norm  # some steps were clipped: the norm is before it
    once = Trial(data, config(max_steps=6, eval_every=100, log_every=4, max_grad_norm=max_grad_norm),
                 tmp_path / "once", tokenizer, micro_batch=16, scaled=scaled)
    once.run()
    for name, tensor in every.model.state_dict().items():
        assert torch.equal(tensor, once.model.state_dict()[name]), name
        torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("on_device,adam", [(False, False), (True, False), (True, True)],
                         ids=["read-each-step", "on-device", "on-device-fused-adamw"])
def test_a_non_finite_loss_skips_its_update_and_the_schedule_goes_on(tmp_path: Path, tokenizer: object,
                                                                     on_device: bool, adam: bool) -> None:
    """Example 0 has a NaN feature: the step whose batch holds it is skipped (the weights stay), counted, and
    the learning rate still moves on; the other steps train. On a GPU the scaler skips it on the device, without
    the host reading the loss (the fused optimizer takes its found_inf), and the loop counts it when it logs."""
    data = examples(64, poison=[0])
    trial = Trial(data, config(max_steps=2, eval_every=100, skip_nonfinite=1), tmp_path, tokenizer,
                  on_device=on_device, adam=adam)
    sampler = EpochSampler(64, seed=1, batch_size=32)
    poisoned_step = 1 if 0 in [*sampler][:32] else 2
    before = {name: tensor.clone() for name, tensor in trial.model.state_dict().items()}
    seen: List[Dict[str, torch.Tensor]] = []

    class Weights(Hook):
        def on_step_end(self, progress: Progress, logged: object) -> None:
            seen.append({name: tensor.clone() for name, tensor in trial.model.state_dict().items()})

    trial.hooks.append(Weights())
    trial.run()
    assert trial.progress.nonfinite_steps == 1 and trial.scheduler.last_epoch == 2
    unchanged = seen[poisoned_step - 1] if poisoned_step == 2 else before
    after_poison = seen[poisoned_step - 1]
    assert all(torch.equal(after_poison[name], unchanged[name]) for name in before)
    assert not all(torch.equal(seen[-1][name], before[name]) for name in before)  # the good step trained


@pytest.mark.parametrize("on_device,log_every,when", [(False, 1, "at step 1"), (True, 1, "by step 1"),
                                                       (True, 4, "by step 4")])
def test_more_non_finite_losses_than_allowed_stop_with_the_last_good_checkpoint(
        tmp_path: Path, tokenizer: object, on_device: bool, log_every: int, when: str) -> None:
    """Read each step, the first non-finite loss stops the run; skipped on the device, at the next read of the loss
    (the next log, here), every step until then skipped: the weights are the first ones."""
    data = examples(32, poison=[5])  # every step's batch holds it
    trial = Trial(data, config(max_steps=6, eval_every=100, checkpoint_every=100, skip_nonfinite=0,
                               log_every=log_every), tmp_path, tokenizer, on_device=on_device, adam=on_device)
    before = {name: tensor.clone() for name, tensor in trial.model.state_dict().items()}
    with pytest.raises(Diverged, match=f"the training loss is nan {when}: stopped, and no checkpoint had been "
                                       "written yet") as stopped:
        trial.run()
    assert stopped.value.step == int(when.split()[-1]) and math.isnan(stopped.value.loss)
    assert all(torch.equal(tensor, before[name]) for name, tensor in trial.model.state_dict().items())


class Skips(Hook):
    """Each log's count of the steps the loss scaler skipped since the last, and its scale (None: not logged)."""

    def __init__(self) -> None:
        self.rows: List[tuple] = []

    def on_step_end(self, progress: Progress, logged: Optional[Dict[str, float]]) -> None:
        if logged is not None:
            self.rows.append((progress.step, logged.get("train/skipped_steps"), logged.get("train/loss_scale")))


def test_the_steps_the_loss_scaler_skips_and_its_scale_are_logged(tmp_path: Path, tokenizer: object,
                                                                  recwarn: pytest.WarningsRecorder) -> None:
    """Under fp16 the loss scaler skips a step whose scaled gradients overflow, and halves its scale: a few at the
    start are expected, step after step is a run that has stopped training. Neither was logged anywhere. Each log
    now gives the steps skipped since the last and the scale, which is the initial one halved once for each. The
    schedule moves on at a skipped first step without torch's warning that it was stepped before the optimizer."""
    data, skips = examples(56), Skips()
    trial = Trial(data, config(max_steps=16, eval_every=100, log_every=4), tmp_path, tokenizer, fp16=True,
                  init_scale=2.0**26, hooks=[skips])
    trial.run()
    steps, skipped, scales = zip(*skips.rows)
    assert steps == (4, 8, 12, 16) and sum(skipped) > 4 and skipped[-1] == 0, skips.rows  # overflowed, then found
    assert list(scales) == [2.0**26 * 0.5 ** sum(skipped[:i + 1]) for i in range(4)]     # its level, no growth
    assert trial.scheduler.last_epoch == 16 and not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]


def test_a_run_resumed_between_two_logs_logs_the_scalers_skips_as_an_unbroken_run(tmp_path: Path,
                                                                                  tokenizer: object) -> None:
    """Stopped at step 3 of a log every 4, the skips of steps 1 to 3 were in no log and no checkpoint: the resumed
    run's log at step 4 gave step 4's alone. The checkpoint keeps them; the whole run's count is its result's."""
    data, settings = examples(56), config(max_steps=12, eval_every=100, checkpoint_every=100, log_every=4)
    whole, before, resumed = Skips(), Skips(), Skips()
    unbroken = Trial(data, settings, tmp_path / "whole", tokenizer, fp16=True, init_scale=2.0**26, hooks=[whole])
    result = unbroken.run()
    assert whole.rows[0][1] > 3 and result.skipped_steps == sum(row[1] for row in whole.rows)  # steps 1-3 skipped
    stop = StopRequest()

    class Signal(Hook):
        def on_step_end(self, progress: Progress, logged: object) -> None:
            if progress.step == 2:
                stop.signal = "SIGTERM"

    first = Trial(data, settings, tmp_path / "run", tokenizer, fp16=True, init_scale=2.0**26, hooks=[Signal(), before])
    with pytest.raises(Preempted):
        first.run(stop)
    snapshot = first.checkpoints.latest()
    assert snapshot is not None and snapshot.step == 3 and before.rows == []
    second = Trial(data, settings, tmp_path / "run", tokenizer, fp16=True, init_scale=2.0**26, hooks=[resumed])
    second.state.load_state_dict(snapshot.state)
    assert second.run().skipped_steps == result.skipped_steps and resumed.rows == whole.rows


def test_a_warning_given_at_every_step_is_shown_once(tmp_path: Path, tokenizer: object) -> None:
    """Python shows a warning once per place it is given from (its 'default' action); the loop's filter of the
    scheduler's first-step warning, once set around every step, made each step show it again."""
    class Warns(Hook):
        def on_step_end(self, progress: Progress, logged: object) -> None:
            warnings.warn("the same every step", UserWarning, stacklevel=1)

    trial = Trial(examples(56), config(max_steps=6, eval_every=100), tmp_path, tokenizer, hooks=[Warns()])
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        trial.run()
    assert [str(each.message) for each in shown].count("the same every step") == 1


@pytest.mark.parametrize("on_device", [False, True], ids=["cpu-fp32", "gpu-bf16"])
def test_a_scaler_skip_outside_fp16_is_counted_and_there_is_no_scale_to_log(tmp_path: Path, tokenizer: object,
                                                                         on_device: bool) -> None:
    """On a GPU in bf16 or fp32 the scaler (at scale 1) skips a step whose gradients are not finite: counted in
    the log as fp16's are, without a scale. On the CPU outside fp16 there is no scaler: neither key."""
    skips = Skips()
    trial = Trial(examples(64, poison=[0]), config(max_steps=2, eval_every=100, skip_nonfinite=1, log_every=2),
                  tmp_path, tokenizer, on_device=on_device, hooks=[skips])
    trial.run()
    assert skips.rows == [(2, 1, None)] if on_device else [(2, None, None)]


@pytest.mark.parametrize("max_grad_norm", [0.25, None], ids=["clipped", "not-clipped"])
def test_skipping_on_the_device_trains_as_reading_the_loss_each_step(tmp_path: Path, tokenizer: object,
                                                                    max_grad_norm: Optional[float]) -> None:
    """The GPU's scaler, at scale 1, changes no bit of the training: the same weights, fused AdamW's state too."""
    data = examples(56)
    trials = [Trial(data, config(max_steps=6, eval_every=100, max_grad_norm=max_grad_norm, log_every=4),
                    tmp_path / str(on_device), tokenizer, micro_batch=16, on_device=on_device, adam=True)
              for on_device in (False, True)]
    for trial in trials:
        trial.run()
    host, device = (trial.optimizer.state_dict() for trial in trials)
    for name, tensor in trials[0].model.state_dict().items():
        assert torch.equal(tensor, trials[1].model.state_dict()[name]), name
    for index, state in host["state"].items():
        assert all(torch.equal(state[key], device["state"][index][key]) for key in state)


def test_early_stopping_ends_training_after_patience_evaluations_without_improvement(tmp_path: Path,
                                                                                   tokenizer: object) -> None:
    """Evaluated every 2 steps: 0.5, 0.7 (best), 0.69, 0.70, ...; patience 2 with min_delta 0.001 stops at the
    fourth evaluation, step 8 of 20, and the best stays the second."""
    trial = Trial(examples(64), config(max_steps=20, eval_every=2), tmp_path, tokenizer,
                  objectives=[0.5, 0.7, 0.69, 0.70, 0.9, 0.9])
    early = EarlyStopping(patience=2, min_delta=0.001, metric="accuracy")
    trial.hooks.append(early)
    result = trial.run()
    assert trial.evaluated == [2, 4, 6, 8] and result.steps == 8 and early.stopped_at == 8
    assert result.best.step == 4 and result.best.objective == 0.7


def test_a_pruned_run_reports_each_evaluation_and_ends_at_the_evaluation_after_the_searchs_word(
        tmp_path: Path, tokenizer: object) -> None:
    """The search reads evaluations.jsonl and writes prune.json between two evaluations (here after step 4's):
    training ends at the next one, step 6 of 20, and the best evaluation so far stays the result."""
    folder = Storage(str(tmp_path / "run"))
    pruning = Pruning(folder, World())

    class Sweeper(Hook):
        def on_evaluation(self, evaluation: Evaluation, *, improved: bool) -> None:
            reported = [json.loads(line) for line in folder.read_bytes("evaluations.jsonl").splitlines()]
            assert reported[-1] == {"step": evaluation.step, "objective": evaluation.objective}
            if evaluation.step == 4:
                folder.write_text("prune.json", json.dumps({"why": "below the median"}))

    trial = Trial(examples(64), config(max_steps=20, eval_every=2), tmp_path / "checkpoints", tokenizer,
                  objectives=[0.5, 0.7, 0.6, 0.9], hooks=[pruning, Sweeper()])
    result = trial.run()
    assert trial.evaluated == [2, 4, 6] and result.steps == 6 and pruning.pruned_at == 6
    assert result.best.step == 4 and result.best.objective == 0.7
    assert [json.loads(line)["step"] for line in folder.read_bytes("evaluations.jsonl").splitlines()] == [2, 4, 6]


def test_checkpoints_at_every_evaluation_and_every_n_steps_keeping_the_newest_and_the_best(
        tmp_path: Path, tokenizer: object) -> None:
    trial = Trial(examples(64), config(max_steps=10, eval_every=4, checkpoint_every=3, keep_checkpoints=2),
                  tmp_path, tokenizer, objectives=[0.9, 0.1, 0.2])
    written: List[int] = []

    class Saved(Hook):
        def on_checkpoint(self, step: int, where: str) -> None:
            written.append(step)

    trial.hooks.append(Saved())
    trial.run()
    assert written == [3, 4, 6, 8, 9, 10]  # every 3 steps, at each evaluation (4, 8) and at the end
    assert trial.evaluated == [4, 8, 10]
    assert trial.saved_steps() == [4, 9, 10]  # the two newest, and the best (step 4's 0.9)


def test_a_signal_stops_at_the_next_step_boundary_with_a_checkpoint(tmp_path: Path, tokenizer: object) -> None:
    stop = StopRequest()

    class Signal(Hook):
        def on_step_end(self, progress: Progress, logged: object) -> None:
            if progress.step == 3:
                stop.signal = "SIGTERM"  # as the handler notes a signal inside the training steps

    trial = Trial(examples(64), config(max_steps=10, eval_every=100, checkpoint_every=100), tmp_path, tokenizer,
                  hooks=[Signal()])
    with pytest.raises(Preempted) as preempted:
        trial.run(stop)
    assert preempted.value.step == 4 and preempted.value.signal == "SIGTERM"  # the step in flight finished
    assert trial.saved_steps() == [4]


def test_a_checkpoint_folder_whose_hold_was_lost_is_not_written(tmp_path: Path, tokenizer: object) -> None:
    """A run paused past the claim's staleness (a stopped process, a stalled mount) and taken over in its
    train.checkpoint_dir by another run: its next checkpoint would overwrite the other run's. Like the output
    folder's hold, the checkpoint folder's is checked before each checkpoint, and nothing more is written."""
    trial = Trial(examples(64), config(max_steps=10, eval_every=100, checkpoint_every=3), tmp_path, tokenizer)
    storage = trial.checkpoints.storage
    with Claim.take(storage, use=CHECKPOINTS_CLAIM, heartbeat=0.05, stale_after=0.5) as claim:
        trial.checkpoints.claim = claim
        (tmp_path / CHECKPOINTS_CLAIM.file).write_text(json.dumps(
            {**json.loads((tmp_path / CHECKPOINTS_CLAIM.file).read_text()), "token": "another run's"}))
        deadline = time.monotonic() + 5
        while not claim.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(ClaimLostError, match=f"another run took over {tmp_path} while this run was writing"):
            trial.run()
    assert trial.saved_steps() == []


def test_resumed_from_a_checkpoint_it_ends_where_an_uninterrupted_loop_ends(tmp_path: Path, tokenizer: object) -> None:
    """Stopped after step 7 of 12 (mid-epoch: 64 examples, batches of 24), then a new loop restores every part
    from the checkpoint and trains on: the same weights, bit for bit, and the same best evaluation."""
    data = examples(64)
    settings = config(batch_size=24, max_steps=12, eval_every=5, checkpoint_every=100)
    whole = Trial(data, settings, tmp_path / "whole", tokenizer, micro_batch=8)
    whole.run()

    stop = StopRequest()

    class Signal(Hook):
        def on_step_end(self, progress: Progress, logged: object) -> None:
            if progress.step == 6:
                stop.signal = "SIGTERM"

    first = Trial(data, settings, tmp_path / "resumed", tokenizer, micro_batch=8, hooks=[Signal()])
    with pytest.raises(Preempted):
        first.run(stop)
    snapshot = first.checkpoints.latest()
    assert snapshot is not None and snapshot.step == 7 and 0 < snapshot.state["progress"]["examples_in_epoch"] < 64
    second = Trial(data, settings, tmp_path / "resumed", tokenizer, micro_batch=8)
    second.state.load_state_dict(snapshot.state)
    second.run()
    assert second.progress.step == 12 and second.progress.examples == whole.progress.examples
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], tensor), name
    assert second.best.evaluation == whole.best.evaluation



class Logged(Hook):
    """The training metrics each logging step gives, the measured ones (throughput) left out."""

    def __init__(self) -> None:
        self.rows: List[tuple] = []

    def on_step_end(self, progress: Progress, logged: Optional[Dict[str, float]]) -> None:
        if logged is not None:
            self.rows.append((progress.step, logged["train/loss"], logged["train/lr"], logged["train/epoch"],
                              logged.get("train/grad_norm")))


def stopped_then_resumed(data: List[Dict[str, torch.Tensor]], settings: TrainConfig, folder: Path, tokenizer: object,
                         *, after_step: int, hooks: Sequence[Hook] = (), resumed_hooks: Sequence[Hook] = (),
                         objectives: Sequence[float] = ()) -> "Trial":
    """A loop stopped by a signal at ``after_step`` + 1 (with its checkpoint), then a new loop restored from
    that checkpoint and run to its end: the second trial."""
    stop = StopRequest()

    class Signal(Hook):
        def on_step_end(self, progress: Progress, logged: object) -> None:
            if progress.step == after_step:
                stop.signal = "SIGTERM"

    first = Trial(data, settings, folder, tokenizer, hooks=[Signal(), *hooks], objectives=objectives)
    with pytest.raises(Preempted):
        first.run(stop)
    snapshot = first.checkpoints.latest()
    assert snapshot is not None and snapshot.step == after_step + 1
    second = Trial(data, settings, folder, tokenizer, hooks=list(resumed_hooks), objectives=objectives[
        len(first.evaluated):])
    second.state.load_state_dict(snapshot.state)
    second.run()
    return second


def test_a_resumed_loop_logs_the_loss_over_the_same_steps_with_the_same_values(tmp_path: Path,
                                                                              tokenizer: object) -> None:
    """Logged every 3 steps, stopped with a checkpoint at step 7: the loss logged at step 9 is the mean of
    steps 7, 8 and 9, the first of them trained before the stop, exactly as an unbroken loop logs it."""
    data = examples(64)
    settings = config(max_steps=12, log_every=3, eval_every=100, checkpoint_every=100)
    whole, resumed, before = Logged(), Logged(), Logged()
    Trial(data, settings, tmp_path / "whole", tokenizer, hooks=[whole]).run()
    stopped_then_resumed(data, settings, tmp_path / "resumed", tokenizer, after_step=6, hooks=[before],
                         resumed_hooks=[resumed])
    assert [row[0] for row in whole.rows] == [3, 6, 9, 12]
    assert before.rows + resumed.rows == whole.rows  # every value equal, not merely close


@pytest.mark.parametrize("max_steps,steps", [(1, [1]), (5, [3, 5]), (6, [3, 6])])
def test_the_last_step_is_logged_whatever_log_every(tmp_path: Path, tokenizer: object, max_steps: int,
                                                    steps: List[int]) -> None:
    """train.max_steps=1 with log_every 3 logged no train/loss at all (no point in the report's learning curves),
    and max_steps 5 none of steps 4 and 5: the last step logs the mean over the steps since the last log, with its
    gradient norm."""
    logged = Logged()
    Trial(examples(64), config(max_steps=max_steps, log_every=3, eval_every=100), tmp_path, tokenizer,
          hooks=[logged]).run()
    assert [row[0] for row in logged.rows] == steps
    every = Logged()  # the loss of each step, to average by hand
    Trial(examples(64), config(max_steps=max_steps, eval_every=100), tmp_path / "every", tokenizer,
          hooks=[every]).run()
    since = [row[1] for row in every.rows if row[0] > (steps[-2] if len(steps) > 1 else 0)]
    assert logged.rows[-1][1] == pytest.approx(sum(since) / len(since), rel=1e-6)
    assert logged.rows[-1][4] == pytest.approx(every.rows[-1][4], rel=1e-6)  # the last step's gradient norm


@pytest.mark.parametrize("first,then", [
    ({"patience": 1, "min_delta": 0.0}, {"patience": 3, "min_delta": 0.0}),
    ({"patience": 2, "min_delta": 0.05}, {"patience": 2, "min_delta": 0.0}),
])
def test_early_stopping_judged_again_under_new_settings_stops_where_a_run_with_them_stops(
        tmp_path: Path, tokenizer: object, first: Dict[str, float], then: Dict[str, float]) -> None:
    """A loop that early stopping ended, continued from its last checkpoint under a larger patience or a
    smaller min_delta, goes on from the evaluations it had and stops where a loop started with those settings
    does: the same steps evaluated, the same stop, the same best, the same weights."""
    objectives = [0.5, 0.7, 0.69, 0.72, 0.70, 0.71, 0.69, 0.68, 0.9, 0.9]
    settings = config(max_steps=20, eval_every=2, checkpoint_every=100)
    data = examples(64)
    whole = Trial(data, settings, tmp_path / "whole", tokenizer, objectives=objectives,
                  hooks=[EarlyStopping(metric="accuracy", **then)])  # type: ignore[arg-type]
    whole.run()
    earlier = EarlyStopping(metric="accuracy", **first)  # type: ignore[arg-type]
    short = Trial(data, settings, tmp_path / "continued", tokenizer, objectives=objectives, hooks=[earlier])
    short.state.register("early_stopping", earlier, optional=True)  # its counters in the checkpoint, as in a run
    short.run()
    assert short.progress.step < whole.progress.step  # the first settings stopped it earlier
    snapshot = short.checkpoints.latest()
    assert snapshot is not None and snapshot.step == short.progress.step
    later = EarlyStopping(metric="accuracy", **then)  # type: ignore[arg-type]
    continued = Trial(data, settings, tmp_path / "continued", tokenizer, objectives=objectives[len(short.evaluated):],
                      hooks=[later])
    continued.state.register("early_stopping", later, optional=True)
    continued.state.load_state_dict(snapshot.state)
    continued.run()
    assert short.evaluated + continued.evaluated == whole.evaluated
    assert continued.progress.step == whole.progress.step == later.stopped_at
    assert continued.best.evaluation == whole.best.evaluation
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(continued.model.state_dict()[name], tensor), name


def test_the_early_stopping_message_names_the_kept_best_checkpoint(tmp_path: Path, tokenizer: object,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """0.70 rises over 0.69 by less than min_delta: early stopping still counts from 0.69, but 0.70 is the best
    evaluation, whose checkpoint stays the model; the message names that one, with its step."""
    trial = Trial(examples(64), config(max_steps=20, eval_every=2), tmp_path, tokenizer,
                  objectives=[0.69, 0.70, 0.65, 0.6])
    trial.hooks.append(EarlyStopping(patience=2, min_delta=0.05, metric="accuracy"))
    with caplog.at_level("INFO", logger="nli.train.hooks"):
        trial.run()
    assert trial.best.evaluation is not None and trial.best.evaluation.step == 4
    assert ("step 6: stopping early: no improvement of accuracy in the last 2 evaluations (train.early_stopping."
            "patience=2, min_delta=0.05); the best checkpoint, step 4 (accuracy=0.7000), stays the model"
            ) in caplog.text


@pytest.mark.parametrize("dtype,advice", [
    (torch.float32, "Lower optimizer.lr, or let train.skip_nonfinite=N"),
    (torch.bfloat16, "Lower optimizer.lr, compute in precision=fp32, or let"),
    (torch.float16, "Lower optimizer.lr, compute in precision=bf16 or fp32 (fp16 overflows first), or let"),
])
def test_a_non_finite_loss_advises_only_the_precision_changes_that_apply(tmp_path: Path, tokenizer: object,
                                                                         dtype: torch.dtype, advice: str) -> None:
    trial = Trial(examples(32, poison=[5]), config(max_steps=2, eval_every=100), tmp_path, tokenizer)
    loop = trial.loop()
    loop.opt = dataclasses.replace(loop.opt, compute=Compute(device=torch.device("cpu"), dtype=dtype))
    with pytest.raises(Diverged) as stopped, StopRequest() as request, request.at_step_boundaries():
        loop.run(trial.progress, trial.best, request)
    assert advice in str(stopped.value)
    assert dtype != torch.float32 or "precision" not in str(stopped.value)


def test_steps_under_the_clipping_norm_are_left_as_clip_grad_norm_leaves_them(
        tmp_path: Path, tokenizer: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU a step whose gradient norm is under train.max_grad_norm is not multiplied by clip_grad_norm_'s
    factor of 1 (a pass over every gradient that changes nothing): with a norm that some steps pass and others
    do not, only the others are scaled, and the weights are those of torch's clip_grad_norm_, bit for bit."""
    data, norms = examples(64), []
    by_hand(data, steps=6, batch_size=32, max_grad_norm=None, norms=norms)
    threshold = sorted(norms)[len(norms) // 2]  # about half the steps clipped
    clipped: List[float] = []
    expected = by_hand(data, steps=6, batch_size=32, max_grad_norm=threshold, norms=clipped)
    scale = torch.nn.utils.clip_grads_with_norm_
    scaled: List[float] = []
    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_",
                        lambda params, max_norm, norm: (scaled.append(float(norm)), scale(params, max_norm, norm)))
    trial = Trial(data, config(max_steps=6, eval_every=100, max_grad_norm=threshold), tmp_path, tokenizer,
                  micro_batch=32)
    trial.run()
    assert scaled == pytest.approx([norm for norm in clipped if norm + 1e-6 > threshold], rel=1e-6)
    assert 0 < len(scaled) < 6
    for name, tensor in trial.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
