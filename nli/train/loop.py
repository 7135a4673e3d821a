"""The training loop: mixed precision, gradient accumulation and clipping, evaluation and checkpoints
on schedule, and a clean stop on a signal, a non-finite loss or a hook's request.

Plain PyTorch, top to bottom. The loss is summed on the device. A step with a non-finite loss is
skipped before it reaches the weights: on a GPU by the loss scaler on the device (its found_inf, which
the fused optimizer takes), counted when the loss is next read, so that the host never waits for the
GPU at a step; elsewhere by reading the loss each step. What happens around the steps (logging, the
progress bar, early stopping) is in hooks (nli.train.hooks).
"""

from __future__ import annotations

import logging
import math
import signal
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple, cast

import torch

from nli.config.identity import own_folder
from nli.config.schema import TrainConfig
from nli.data.loaders import Contents, TrainBatches
from nli.errors import ConfigError, DataError, Diverged
from nli.evaluate import oom
from nli.evaluate.evaluation import Evaluation
from nli.runtime import xla
from nli.runtime.device import Compute, PeakMemory
from nli.runtime.distributed import World, keeps_gradients, no_sync
from nli.runtime.signals import Preempted, StopRequest
from nli.train.checkpoint import BestEvaluation, Checkpointer, Progress, rng_kept
from nli.train.hooks import Hook

log = logging.getLogger(__name__)


def training_loss(output: Any, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """The model's own loss; with label smoothing, cross-entropy on its logits (in fp32, as
    transformers computes its own) against labels smoothed by ``label_smoothing``."""
    if not label_smoothing:
        return output.loss
    return torch.nn.functional.cross_entropy(output.logits.float(), labels, label_smoothing=label_smoothing)


# The contents of a training set that no checkpoint records (a test's own loop); a resume is not checked against it.
_NOT_KNOWN = Contents(text="", labels="")


@dataclass(frozen=True)
class Plan:
    """How much to train and how often to look, in optimizer steps."""

    total_steps: int
    examples_per_epoch: int
    accumulation: int  # micro-batches per optimizer step on each process
    eval_every: int
    log_every: int
    checkpoint_every: int
    max_grad_norm: float | None
    skip_nonfinite: int  # steps with a non-finite loss to skip before stopping
    label_smoothing: float  # cross-entropy's label smoothing; 0: the model's own loss
    # What the training set holds (nli.data.loaders.contents_of), which a resumed run's must too
    contents: Contents = _NOT_KNOWN
    # The eval split whose main metric picks the best checkpoint, and what it holds as scored: a resumed run's too
    main_split: str = ""
    eval_contents: Contents = _NOT_KNOWN

    @classmethod
    def make(cls, train: TrainConfig, *, examples_per_epoch: int, world_size: int, accumulation: int,
             contents: Contents = _NOT_KNOWN, main_split: str = "", eval_contents: Contents = _NOT_KNOWN) -> "Plan":
        last = examples_per_epoch % train.batch_size
        if 0 < last < world_size:  # a process with no example would stall the others' gradient all-reduce
            raise ConfigError(f"each epoch ends with a batch of {last} example(s), fewer than the {world_size} "
                              f"processes; change train.batch_size={train.batch_size} or data.max_train_samples so "
                              "that it holds none or at least one per process")
        steps_per_epoch = math.ceil(examples_per_epoch / train.batch_size)
        return cls(total_steps=train.max_steps or math.ceil(train.epochs * steps_per_epoch),
                   examples_per_epoch=examples_per_epoch, accumulation=accumulation,
                   eval_every=train.eval_every or steps_per_epoch, log_every=train.log_every,
                   checkpoint_every=train.checkpoint_every, max_grad_norm=train.max_grad_norm,
                   skip_nonfinite=train.skip_nonfinite, label_smoothing=train.label_smoothing, contents=contents,
                   main_split=main_split, eval_contents=eval_contents)

    def check_resume(self, progress: Progress) -> None:
        """Refuse to resume from a checkpoint's ``progress`` that this plan cannot go on from: one past its end, or
        of other training or evaluation data. Called as the checkpoint is restored, before the folder records this
        attempt's config (nli.output.folder.record_run), so that a refusal leaves the folder as it was."""
        self._check_length(progress)
        self._check_training_set(progress)
        self._check_eval_set(progress)

    def _check_length(self, progress: Progress) -> None:
        """Only a new train.max_steps or train.epochs can end the plan before the checkpoint's step. The folder refuses
        it before anything loads (nli.output.folder.check_continuation) where the checkpoint tells an epoch's size;
        this is for the ones that cannot (from before it was kept, written in the first epoch)."""
        if progress.step > self.total_steps:
            raise ConfigError(f"this run already trained {progress.step} steps, more than the {self.total_steps} "
                              "that train.max_steps or train.epochs now plan: a run cannot be shortened. Start it "
                              f"afresh in another {own_folder()}")

    def _check_training_set(self, progress: Progress) -> None:
        """Refuse to resume on a training set of another size, or of the same size with other text or labels: the
        checkpoint's ``progress`` (its place in its epoch, its order, the epochs the plan counts) is of the examples it
        trained on (a checkpoint from before the size was kept: 0; before the digests were: "")."""
        before, now = progress.examples_per_epoch, self.examples_per_epoch
        if before and before != now:
            raise DataError(f"this run trained on {before} training examples an epoch, and its training set now has "
                            f"{now}: the training data changed since its checkpoint of step {progress.step} "
                            "(data.dir's or data.files' training file). Put the training data back as it was, or start "
                            f"the run afresh in another {own_folder()}")
        changed = self.contents.differs_from(Contents(text=progress.text_digest, labels=progress.labels_digest))
        if changed:
            raise DataError(f"this run trained on {now} training examples an epoch, and its training set now has "
                            f"{now} that are not those ({changed}): the training data changed since its checkpoint "
                            f"of step {progress.step} (data.dir's or data.files' training file), and the run would go "
                            "on with other examples than it trained on. Put the training data back as it was, or start "
                            f"the run afresh in another {own_folder()}")

    def _check_eval_set(self, progress: Progress) -> None:
        """Refuse to resume on a main eval split with other text or labels than the checkpoint's evaluations scored
        (one of another size among them): the best so far, which picks the checkpoint to export and which early
        stopping and a search's pruning measure each evaluation against, is a score on those examples. Its other
        splits (MNLI's mismatched) and eval.extra's sets only report, scored once more at the end on the files as they
        are then: they are not checked. data.max_eval_samples, part of the run's identity, is the same as the
        checkpoint's (nli.output.folder), so the examples compared are those the evaluations scored."""
        changed = self.eval_contents.differs_from(Contents(text=progress.eval_text_digest,
                                                           labels=progress.eval_labels_digest))
        if changed:
            raise DataError(f"this run was evaluated on {self.main_split} examples up to its checkpoint of step "
                            f"{progress.step}, and its {self.main_split} split now holds others ({changed}): the "
                            f"evaluation data changed since (data.dir's or data.files' {self.main_split} file, or the "
                            "Hub's split), and the run would pick its best checkpoint, and judge early stopping and a "
                            "search's pruning, by scores on two sets. Put the evaluation data back as it was, or start "
                            f"the run afresh in another {own_folder()}")

    @property
    def evaluations(self) -> int:
        """How many times the run evaluates: every ``eval_every`` steps, and at the end."""
        return math.ceil(self.total_steps / self.eval_every)


@dataclass(frozen=True)
class Optimization:
    """What trains and what steps it."""

    model: torch.nn.Module  # the model itself: evaluated and checkpointed
    trained: torch.nn.Module  # what the steps run: the model, in DDP under data parallelism, or compiled
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    compute: Compute
    world: World
    # A non-finite step is skipped on the device (the scaler's found_inf, :func:`grad_scaler`) and counted when
    # the loss is next read (a log, an evaluation, a checkpoint); else the loss is read every step to skip it.
    skips_on_device: bool = False


class Scaler:
    """The loss scaler's part of a checkpoint. A checkpoint of a scaler that was off (the CPU's, outside fp16) holds
    none, which a scaler that is on (a GPU's) would refuse: resumed there, it starts afresh."""

    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self.scaler = scaler

    def state_dict(self) -> Dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state:
            self.scaler.load_state_dict(state)


def grad_scaler(compute: Compute) -> Tuple[torch.amp.GradScaler, bool]:
    """The loss scaler, and whether it skips non-finite steps on the device. fp16's dynamic loss scaling; on a
    GPU in any precision, for that skip: a step whose gradients are not finite leaves the weights as they were
    (its found_inf goes to the fused optimizer's kernel), where reading the loss to skip it would make the host
    wait for the GPU every step. Outside fp16 the scale stays 1 (halved only at a skipped step: a power of two,
    exact), so the gradients are the plain loss's. On the CPU the loss is read every step (no GPU to wait for),
    and on XLA too (its step is one graph)."""
    on_device = compute.device.type == "cuda"
    if compute.dtype == torch.float16 or not on_device:
        return torch.amp.GradScaler(compute.device.type, enabled=compute.dtype == torch.float16), on_device
    return torch.amp.GradScaler(compute.device.type, init_scale=1.0, growth_interval=2**30), True


@dataclass
class TrainResult:
    best: Evaluation
    steps: int
    examples: int  # training examples processed
    tokens: int  # their real (non-pad) tokens
    seconds: float  # wall time in training steps, evaluation and saving excluded
    peak_memory_bytes: int = 0  # held by the training steps (nli.runtime.device.PeakMemory)
    skipped_steps: int = 0  # optimizer steps that left the weights as they were, their loss or gradients not finite

    @property
    def examples_per_second(self) -> float:
        return self.examples / max(self.seconds, 1e-9)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


class Loop:
    """Trains from ``progress`` (zero, or where a checkpoint left off) to ``plan.total_steps``;
    evaluates every ``plan.eval_every`` steps and at the end, and checkpoints at every evaluation,
    every ``plan.checkpoint_every`` steps, and when a signal asks it to stop. Under data parallelism
    every rank runs it in step with the others."""

    def __init__(self, opt: Optimization, batches: TrainBatches, plan: Plan, *,
                 evaluate: Callable[[torch.nn.Module, int], Evaluation], checkpointer: Checkpointer,
                 hooks: Sequence[Hook], micro_batches: Optional[oom.MicroBatches] = None) -> None:
        # The micro-batch size that fits (nli.evaluate.oom): the configured one, or a checkpoint's smaller one.
        loader = batches.loader
        self.micro_batches = micro_batches or oom.MicroBatches(loader.batch_size or 1, opt.compute, opt.world)
        self.opt, self.loader, self.sampler, self.plan = opt, self.micro_batches.loader(loader), batches.sampler, plan
        self.evaluate, self.checkpointer, self.hooks = evaluate, checkpointer, hooks
        self.window = _Window(opt.compute.device)
        # Steps skipped on the device, not yet counted (Optimization.skips_on_device); made only where used.
        self._nonfinite = torch.zeros((), dtype=torch.int64, device=opt.compute.device) if opt.skips_on_device else None
        self._scaler_skips = _ScalerSkips(opt.scaler, opt.compute)
        self._signals: Optional[Callable[[], float]] = None  # the ranks' signals at the last step, to read at this one
        self.memory = PeakMemory(opt.compute.device)
        self._set_to_none = not keeps_gradients(opt.trained)  # DDP's bucket views stay (wrap)

    def run(self, progress: Progress, best: BestEvaluation, stop: StopRequest) -> TrainResult:
        self.opt.trained.train()
        clock = _Clock(progress.seconds)
        assert progress.step <= self.plan.total_steps, "refused as the checkpoint is restored (Plan.check_resume)"
        progress.examples_per_epoch, progress.eval_every = self.plan.examples_per_epoch, self.plan.eval_every
        progress.text_digest, progress.labels_digest = self.plan.contents
        progress.eval_text_digest, progress.eval_labels_digest = self.plan.eval_contents
        # A resumed run logs the loss over the same steps as an unbroken one: the checkpoint kept the partial window.
        self.window.resume(progress.window_loss, progress.window_steps)
        self._call("on_start", progress, best)
        self.memory.reset()  # the model's loading and an earlier evaluation are not the steps'
        reason = self._stop_reason()  # a resumed run that had already stopped early
        while progress.step < self.plan.total_steps and reason is None:
            # The same order for the same seed and epoch; after a resume, from where it stopped.
            self.sampler.set_epoch(progress.epoch, start=progress.examples_in_epoch)
            reason = self._epoch(progress, best, stop, clock)
        progress.seconds = clock.training_seconds()
        self._call("on_stop", progress, reason or "completed")
        assert best.evaluation is not None  # the last step, and an early stop, always evaluate
        self._scaler_skips.take(progress)
        # Where the scaler is on, it skipped every step that was (a non-finite loss's too); else the loss was read.
        skipped = progress.scaler_skips if self.opt.scaler.is_enabled() else progress.nonfinite_steps
        return TrainResult(best=best.evaluation, steps=progress.step, examples=progress.examples,
                           tokens=progress.tokens, seconds=progress.seconds,
                           peak_memory_bytes=self.memory.training_peak(), skipped_steps=skipped)

    def _epoch(self, progress: Progress, best: BestEvaluation, stop: StopRequest, clock: "_Clock") -> Optional[str]:
        """Train to the end of the epoch, or of the plan; the reason training ended, if it did."""
        step_loss = torch.zeros((), device=self.opt.compute.device)  # the step's loss, summed on the device
        micro, micros = 0, self._micro_batches(progress)
        for batch in self.loader:
            micro += 1
            if not self._accumulate(batch, step_loss, progress, first=micro == 1, sync=micro == micros):
                return None  # out of memory: the step starts again, in smaller micro-batches
            if micro < micros:
                continue  # accumulate: the optimizer steps once per global batch
            # Every rank must see the same loss, to skip or stop together, and the same signal.
            self.opt.world.sum(step_loss).div_(self.opt.world.world_size)
            stopping = self._agreed_signal(stop)  # read once: a later signal waits for the next step
            self._step(step_loss, progress)
            step_loss.zero_()
            micro, micros = 0, self._micro_batches(progress)
            progress.seconds = clock.training_seconds()
            with clock.paused(self.window), self.memory.paused():
                reason = self._after_step(progress, best, stopping)
            if stopping:
                self._call("on_stop", progress, stopping)
                raise Preempted(progress.step, stopping)
            if reason is not None or progress.step == self.plan.total_steps:
                return reason
        return None

    def _accumulate(self, batch: Dict[str, torch.Tensor], step_loss: torch.Tensor, progress: Progress, *,
                    first: bool, sync: bool) -> bool:
        """Add a micro-batch's loss and gradients to the step's; False where it ran out of memory: the step
        is undone and the loader cut into smaller micro-batches (nli.evaluate.oom), to start the step again."""
        if first:
            self.micro_batches.begin_step()
            self.memory.keep()  # the steps before this one fit
        try:
            step_loss += self._forward_backward(batch, progress, sync=sync)
            return True
        except torch.OutOfMemoryError:
            pass  # handled outside the except clause, whose traceback holds the step's tensors
        self.loader = self.micro_batches.back_off(self.loader, self.opt.trained, global_batch=self.sampler.batch_size)
        self.memory.reset()  # the failed attempt's peak is no step's
        return False

    def _forward_backward(self, batch: Dict[str, torch.Tensor], progress: Progress, *, sync: bool) -> torch.Tensor:
        opt = self.opt
        batch = {k: v.to(opt.compute.device, non_blocking=True) for k, v in batch.items()}
        # Weighted so that the step's gradient is the mean over its global batch, however it is cut
        # into micro-batches and ranks (the epoch's last batch too); x world size, since DDP averages.
        weight = len(batch["labels"]) * opt.world.world_size / self.sampler.step_examples(progress.examples_in_epoch)
        with no_sync(opt.trained, sync=sync):  # only the step's last micro-batch all-reduces
            with opt.compute.autocast():
                loss = training_loss(opt.trained(**batch), batch["labels"], self.plan.label_smoothing) * weight
            opt.scaler.scale(loss).backward()
        return loss.detach()

    def _step(self, step_loss: torch.Tensor, progress: Progress) -> None:
        """The optimizer step (unless the loss is not finite), and the progress it makes."""
        self._step_unless_nonfinite(step_loss, progress)
        examples = self.sampler.step_examples(progress.examples_in_epoch)
        tokens = self.sampler.step_tokens(progress.examples_in_epoch)
        self.window.add(step_loss, examples, tokens)
        progress.step += 1
        progress.examples += examples
        progress.tokens += tokens
        progress.examples_in_epoch += examples
        if progress.examples_in_epoch == self.plan.examples_per_epoch:
            progress.epoch, progress.examples_in_epoch = progress.epoch + 1, 0
        self.window.step()
        self.opt.compute.sync()  # XLA: the step's graph ends here, the same graph every step

    def _after_step(self, progress: Progress, best: BestEvaluation, stopping: Optional[str]) -> Optional[str]:
        """Log, evaluate and checkpoint on schedule; the reason a hook gives to end training, if any."""
        logs = self._logs(progress.step)
        evaluates = progress.step % self.plan.eval_every == 0 or progress.step == self.plan.total_steps
        if logs or evaluates or progress.step % self.plan.checkpoint_every == 0 or stopping:
            self._count_nonfinite(progress)  # where the host reads from the device anyway
        logged = None
        if logs:
            lr = cast(float, self.opt.scheduler.get_last_lr()[0])  # typed float | Tensor; our rates are floats
            logged = self.window.flush(lr=lr, epoch=progress.epoch + progress.examples_in_epoch /
                                       self.plan.examples_per_epoch, scaler=self._scaler_skips.figures(progress))
        self._call("on_step_end", progress, logged)
        evaluation = None
        if evaluates:
            with rng_kept():  # training draws as if it had not evaluated (eval_every changes no weight)
                evaluation = self.evaluate(self.opt.model, progress.step)
                self._call("on_evaluation", evaluation, improved=best.update(evaluation))
        if evaluation or progress.step % self.plan.checkpoint_every == 0 or stopping:
            progress.window_loss, progress.window_steps = self.window.partial()
            self._scaler_skips.take(progress)
            where = self.checkpointer.save(step=progress.step, evaluation=evaluation,
                                           best_step=best.evaluation.step if best.evaluation else None)
            self._call("on_checkpoint", progress.step, where)
        return self._stop_reason() if evaluation else None

    def _logs(self, step: int) -> bool:
        """Whether ``step`` logs the training metrics: every ``log_every`` steps, and the last step, whose loss (over
        the steps since the last log) would else be logged by none (train.max_steps=1 with log_every 3: none at all)."""
        return step % self.plan.log_every == 0 or step == self.plan.total_steps

    def _step_unless_nonfinite(self, step_loss: torch.Tensor, progress: Progress) -> None:
        opt = self.opt
        if self._nonfinite is not None:  # the scaler skips it; counted when the loss is next read
            self._nonfinite += ~torch.isfinite(step_loss)
        # Else reading the loss waits for the device once per optimizer step.
        if opt.skips_on_device or bool(torch.isfinite(step_loss)):
            opt.world.reduce_gradients(opt.optimizer)
            self.window.grad_norm(self._gradient_norm(logs=self._logs(progress.step + 1)))
            with self._scaler_skips.counted():
                oom.optimizer_step(opt.optimizer, opt.scaler, opt.compute)  # scaler.step, backed off on its first
                opt.scaler.update()
        else:
            self.window.grad_norm(None)  # no gradient to speak of: the step is skipped
            step = progress.step + 1
            self._skip_nonfinite(float(step_loss), progress, step=step, when=f"at step {step}")
        _step_schedule(opt.scheduler)  # the schedule keeps time with the steps, skipped or not
        opt.optimizer.zero_grad(set_to_none=self._set_to_none)

    def _gradient_norm(self, *, logs: bool) -> Optional[torch.Tensor]:
        """The gradients' total norm before clipping (a tensor on the device, read when the step is logged),
        clipped to ``max_grad_norm`` where the plan clips. Clipping computes it every step anyway; without
        clipping it is computed on the steps that log it alone (one more pass over the gradients every
        ``log_every`` steps), except on XLA, where computing it every step keeps one graph for every step.
        Under fp16 the gradients are unscaled first: GradScaler's step would unscale them the same way, so
        the update is the same bit for bit. Reading it changes nothing of the training."""
        opt = self.opt
        clips = self.plan.max_grad_norm is not None
        if not (clips or logs or opt.compute.device.type == "xla"):
            return None
        opt.scaler.unscale_(opt.optimizer)  # the true gradients, not the loss-scaled ones
        parameters = list(opt.trained.parameters())
        norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
        if clips:
            assert self.plan.max_grad_norm is not None
            # clip_grad_norm_ in its two halves, which scales by min(1, max_norm / (norm + 1e-6)). On the CPU,
            # where reading the norm waits for nothing, a factor of exactly 1 is not applied: a pass over every
            # gradient (3% of a bf16 step) that changes no bit. A NaN norm scales, as clip_grad_norm_ does.
            unclipped = opt.compute.device.type == "cpu" and bool(self.plan.max_grad_norm / (norm + 1e-6) >= 1.0)
            if not unclipped:
                torch.nn.utils.clip_grads_with_norm_(parameters, self.plan.max_grad_norm, norm)
        return norm

    def _count_nonfinite(self, progress: Progress) -> None:
        """The steps skipped on the device since the last look (Optimization.skips_on_device), counted and judged
        against train.skip_nonfinite as the loop that reads every step's loss does; read where the host waits for
        the device anyway (a log, an evaluation, a checkpoint)."""
        if self._nonfinite is None:
            return
        skipped = int(self._nonfinite.item())
        self._nonfinite.zero_()
        for _ in range(skipped):
            self._skip_nonfinite(math.nan, progress, step=progress.step, when=f"by step {progress.step}")

    def _skip_nonfinite(self, loss: float, progress: Progress, *, step: int, when: str) -> None:
        """One more step skipped for a non-finite loss (``loss``, at ``step``, ``when``: "at step 7", or "by step 10"
        where it was counted later); past train.skip_nonfinite, the run stops."""
        progress.nonfinite_steps += 1
        if progress.nonfinite_steps > self.plan.skip_nonfinite:
            newest = self.checkpointer.checkpoints.newest_step()
            kept = (f"the last good checkpoint, step {newest}, is kept in {self.checkpointer.checkpoints.where()}"
                    if newest is not None else "no checkpoint had been written yet")
            raise Diverged(f"the training loss is {loss} {when}: stopped, and {kept}. Lower optimizer.lr, "
                           f"{_precision_advice(self.opt.compute.dtype)}or let train.skip_nonfinite=N skip up to N "
                           "such steps", step=step, loss=loss)
        log.warning("%s: the loss is %s; skipping this update (%d of train.skip_nonfinite=%d)",
                    when.removeprefix("at "), loss, progress.nonfinite_steps, self.plan.skip_nonfinite)

    def _micro_batches(self, progress: Progress) -> int:
        """This rank's micro-batches in the next optimizer step."""
        return math.ceil(self.sampler.share(progress.examples_in_epoch) / (self.loader.batch_size or 1))

    def _agreed_signal(self, stop: StopRequest) -> Optional[str]:
        """The signal that stops the run, if any rank got one: all ranks stop at the same step. Under data
        parallelism the ranks' signals are reduced at each step and the result read at the next, when that
        reduction has long finished: reading it at once would make the host wait for the GPU at every step. So a
        signal stops the ranks one step after it would stop a single process."""
        world = self.opt.world
        if not world.distributed:
            return stop.signal
        got = self._signals() if self._signals is not None else 0.0
        self._signals = world.max_later(float(signal.Signals[stop.signal]) if stop.signal else 0.0,
                                        self.opt.compute.device)
        return signal.Signals(int(got)).name if got else None

    def _stop_reason(self) -> Optional[str]:
        return next((reason for hook in self.hooks if (reason := hook.stop_reason()) is not None), None)

    def _call(self, point: str, *args: object, **kwargs: object) -> None:
        for hook in self.hooks:
            getattr(hook, point)(*args, **kwargs)


def _precision_advice(dtype: torch.dtype) -> str:
    """What a run in ``dtype`` can change in precision against a non-finite loss: fp16's narrow range
    overflows first, bf16 rounds coarsely; a run already in fp32 has nothing to change there."""
    if dtype == torch.float16:
        return "compute in precision=bf16 or fp32 (fp16 overflows first), "
    if dtype == torch.bfloat16:
        return "compute in precision=fp32, "
    return ""


class _Clock:
    """Training time over every attempt, with evaluation and checkpointing left out."""

    def __init__(self, seconds_before: float) -> None:
        self._before, self._start, self._paused = seconds_before, time.perf_counter(), 0.0

    @contextmanager
    def paused(self, window: "_Window") -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            pause = time.perf_counter() - start
            self._paused += pause
            window.exclude(pause)

    def training_seconds(self) -> float:
        return self._before + time.perf_counter() - self._start - self._paused


def _step_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """``scheduler.step()``. A skipped first step (fp16's scale finding its level) calls no optimizer.step() before
    it, which torch's scheduler takes, at its first step, for calls in the wrong order and warns of: not here. The
    first step's alone: catch_warnings resets every module's record of the warnings it has shown once."""
    if scheduler.last_epoch > 0:
        scheduler.step()
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before", UserWarning)
        scheduler.step()


class _ScalerSkips:
    """The optimizer steps the loss scaler skipped, its gradients not finite: under fp16 an overflow, which halves
    the scale (a few at the start, while the scale finds its level, are expected); on a GPU in any precision, a
    step whose loss was finite and whose gradients were not, which no other count sees (the loss's is
    train.skip_nonfinite's). Counted on the device, from the scale each step leaves (the scaler lowers it at a
    skipped step and at no other), and taken into the run's :class:`Progress` where the host waits for the device
    anyway: at a log, which gives those since the last, and at a checkpoint, which keeps them."""

    def __init__(self, scaler: torch.amp.GradScaler, compute: Compute) -> None:
        self.scaler, self.fp16 = scaler, compute.dtype == torch.float16
        self._count: Optional[torch.Tensor] = None  # not yet taken; made at the first step, on the scale's device

    @contextmanager
    def counted(self) -> Iterator[None]:
        """Around the scaler's step and update: one more skip where the scale came out lower than it went in."""
        # The scale as a tensor, unread (get_scale() would wait for the device): torch's own fused optimizers
        # are handed it this way. None where the scaler is off, or before its first scaled loss.
        before = self.scaler._get_scale_async() if self.scaler.is_enabled() else None
        before = None if before is None else before.clone()
        yield
        if before is not None:
            if self._count is None:
                self._count = torch.zeros((), dtype=torch.int64, device=before.device)
            self._count += self.scaler._get_scale_async() < before  # type: ignore[operator]

    def take(self, progress: Progress) -> None:
        """Add the skips counted on the device to ``progress``'s (reading them waits for the device)."""
        if self._count is not None:
            progress.scaler_skips += int(self._count.item())
            self._count.zero_()

    def figures(self, progress: Progress) -> Dict[str, float]:
        """``train/skipped_steps`` since the last log (an earlier attempt's too, where the run resumed between two)
        where the scaler is on, and under fp16 ``train/loss_scale``."""
        if not self.scaler.is_enabled():
            return {}
        self.take(progress)
        skipped = progress.scaler_skips - progress.scaler_skips_logged
        progress.scaler_skips_logged = progress.scaler_skips
        return {"train/skipped_steps": skipped, **({"train/loss_scale": self.scaler.get_scale()} if self.fp16 else {})}


class _Window:
    """Training loss and throughput since the last log, the loss summed on the device."""

    def __init__(self, device: torch.device) -> None:
        self._loss = torch.zeros((), device=device)
        self._grad_norm: Optional[torch.Tensor] = None  # the last step's, before clipping
        self.restart()

    def restart(self) -> None:
        self._loss.zero_()
        self._grad_norm = None
        self._examples, self._tokens, self._steps = 0, 0, 0
        self._start = time.perf_counter()

    def add(self, loss: torch.Tensor, examples: int, tokens: int) -> None:
        self._loss += loss  # no .item(): reading the loss would wait for the device
        self._examples += examples
        self._tokens += tokens

    def step(self) -> None:
        self._steps += 1

    def grad_norm(self, norm: Optional[torch.Tensor]) -> None:
        """The step's gradient norm (None: not computed), kept unread until the window is flushed."""
        self._grad_norm = norm

    def partial(self) -> Tuple[float, int]:
        """The loss summed over the steps since the last log, and their number: what a checkpoint keeps
        (reading the sum waits for the device, as the checkpoint's own copy does)."""
        return self._loss.item(), self._steps

    def resume(self, loss: float, steps: int) -> None:
        """Go on from a checkpoint's :meth:`partial` window. The sum comes back exactly (a float32 held in a
        float), so the next logged mean equals an unbroken run's; the throughput is measured afresh."""
        self._loss.fill_(loss)
        self._steps = steps

    def exclude(self, seconds: float) -> None:
        """Leave time spent outside training (evaluation, saving) out of the throughput."""
        self._start += seconds

    def flush(self, *, lr: float, epoch: float, scaler: Dict[str, float]) -> Dict[str, float]:
        seconds = time.perf_counter() - self._start
        # Each step's loss is the mean over its global batch, averaged over the ranks.
        out = {"train/loss": self._loss.item() / max(self._steps, 1), "train/lr": lr,
               **({"train/grad_norm": self._grad_norm.item()} if self._grad_norm is not None else {}), **scaler,
               "train/examples_per_second": self._examples / max(seconds, 1e-9),
               "train/tokens_per_second": self._tokens / max(seconds, 1e-9), "train/epoch": epoch}
        if self._loss.device.type == "xla":  # so far: a count that grows after the first epoch means changing shapes
            out["train/xla_compilations"] = xla.compilations()["xla_compilations"]
        self.restart()
        return out
