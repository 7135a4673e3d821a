"""The training loop: mixed precision, gradient accumulation and clipping, periodic evaluation,
checkpoints, and a clean stop on a signal or a non-finite loss.

Plain PyTorch, top to bottom. The loss is summed on the device and read once per optimizer step,
to catch a non-finite loss before it reaches the weights; nothing else waits for the GPU.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Mapping, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from nli import metrics
from nli.checkpoint import Progress
from nli.data import EpochSampler
from nli.metrics import Evaluation
from nli.signals import StopRequest
from nli.config import ConfigError, TaskConfig
from nli.device import autocast
from nli.distributed import World, no_sync
from nli.tracking import Tracker

log = logging.getLogger(__name__)


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

    @classmethod
    def make(cls, *, examples_per_epoch: int, batch_size: int, world_size: int, accumulation: int, epochs: float,
             max_steps: int | None, eval_every: int | None, log_every: int, checkpoint_every: int,
             max_grad_norm: float | None, skip_nonfinite: int) -> "Plan":
        last = examples_per_epoch % batch_size
        if 0 < last < world_size:  # a process with no example would stall the others' gradient all-reduce
            raise ConfigError(f"each epoch ends with a batch of {last} example(s), fewer than the {world_size} "
                              f"processes; change train.batch_size={batch_size} or data.max_train_samples so "
                              "that it holds none or at least one per process")
        steps_per_epoch = math.ceil(examples_per_epoch / batch_size)
        total = max_steps or math.ceil(epochs * steps_per_epoch)
        return cls(total_steps=total, examples_per_epoch=examples_per_epoch, accumulation=accumulation,
                   eval_every=eval_every or steps_per_epoch, log_every=log_every, checkpoint_every=checkpoint_every,
                   max_grad_norm=max_grad_norm, skip_nonfinite=skip_nonfinite)


class Preempted(Exception):
    """A signal asked the run to stop; a checkpoint of ``step`` has been written."""

    def __init__(self, step: int, signal: str) -> None:
        super().__init__(f"{signal} at step {step}")
        self.step, self.signal = step, signal


class NonFiniteLoss(Exception):
    """The loss became NaN or infinite more often than train.skip_nonfinite allows."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"the training loss is {loss} at step {step}")
        self.step, self.loss = step, loss


@dataclass
class TrainResult:
    best: Evaluation
    steps: int
    examples: int  # training examples processed
    tokens: int  # their real (non-pad) tokens
    seconds: float  # wall time in training steps, evaluation and saving excluded

    @property
    def examples_per_second(self) -> float:
        return self.examples / max(self.seconds, 1e-9)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


@dataclass
class Predictions:
    """A model's outputs on one split, in the split's order."""

    values: np.ndarray  # (examples,) label ids, or scores for a regression task
    labels: np.ndarray  # (examples,) the split's labels (-1 where it has none)
    idx: np.ndarray | None  # (examples,) the examples' numbers, where the split keeps them (test)


@torch.no_grad()
def predict(model: torch.nn.Module, loader: DataLoader, task: TaskConfig, *, device: torch.device,
            dtype: torch.dtype) -> Predictions:
    was_training = model.training
    model.eval()
    values, labels, idx = [], [], []
    for batch in loader:
        labels.append(batch.pop("labels"))
        if "idx" in batch:
            idx.append(batch.pop("idx"))
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with autocast(device, dtype):
            logits = model(**batch).logits  # (batch, num_labels)
        values.append(logits.float().squeeze(-1) if task.is_regression else logits.argmax(-1))
    model.train(was_training)
    return Predictions(values=torch.cat(values).cpu().numpy(), labels=torch.cat(labels).numpy(),
                       idx=torch.cat(idx).numpy() if idx else None)


def gather(predictions: Predictions, world: World) -> Predictions:
    """Every rank's predictions on its slice of a split, joined in rank order: the whole split."""
    parts = world.gather(predictions)
    if len(parts) == 1:
        return predictions
    return Predictions(values=np.concatenate([p.values for p in parts]),
                       labels=np.concatenate([p.labels for p in parts]),
                       idx=None if parts[0].idx is None else np.concatenate([p.idx for p in parts]))


def evaluate(model: torch.nn.Module, loaders: Mapping[str, DataLoader], task: TaskConfig, *,
             device: torch.device, dtype: torch.dtype, step: int, world: World) -> Evaluation:
    """Metrics on every eval split; each rank predicts its slice (``data.eval_loader``), and every
    rank gets the same metrics."""
    scores: Dict[str, float] = {}
    for split, loader in loaders.items():
        out = gather(predict(model, loader, task, device=device, dtype=dtype), world)
        scores.update(metrics.compute(task.metrics, out.values, out.labels, suffix=task.eval_splits[split]))
    objective = scores[task.main_metric + task.eval_splits[task.main_split]]
    return Evaluation(step=step, metrics=scores, objective=objective)


# save(progress, best, evaluation) writes a checkpoint; evaluation is None between evaluations.
SaveCheckpoint = Callable[[Progress, Optional[Evaluation], Optional[Evaluation]], None]


def train(*, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          scheduler: torch.optim.lr_scheduler.LRScheduler, scaler: torch.amp.GradScaler, loader: DataLoader,
          sampler: EpochSampler, evaluate_at: Callable[[int], Evaluation], save: SaveCheckpoint, plan: Plan,
          progress: Progress, best: Optional[Evaluation], stop: StopRequest, device: torch.device,
          dtype: torch.dtype, tracker: Tracker, progress_bar: bool, world: World) -> TrainResult:
    """Train from ``progress`` (zero, or where a checkpoint left off) to ``plan.total_steps``;
    evaluate every ``plan.eval_every`` steps and at the end, and checkpoint at every evaluation,
    every ``plan.checkpoint_every`` steps, and when ``stop`` says a signal came. Under data
    parallelism ``model`` is wrapped in DDP and every rank runs this loop in step with the others."""
    model.train()
    window = _Window(device)
    step_loss = torch.zeros((), device=device)  # the current optimizer step's loss, summed on the device
    clock = _Clock(progress.seconds)
    # Redrawn at most every 30 s when the output is a log file rather than a terminal.
    bar = tqdm(total=plan.total_steps, initial=progress.step, desc="train",
               disable=not progress_bar or not world.is_main, dynamic_ncols=True,
               mininterval=0.1 if sys.stderr.isatty() else 30)
    while progress.step < plan.total_steps:
        # The same order for the same seed and epoch; after a resume, from where it stopped.
        sampler.set_epoch(progress.epoch, start=progress.examples_in_epoch)
        micro, micros = 0, _micro_batches(sampler, progress, loader)
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            micro += 1
            # Weighted so that the step's gradient is the mean over its global batch, however it is cut
            # into micro-batches and ranks (the epoch's last batch too); x world size, since DDP averages.
            weight = len(batch["labels"]) * world.world_size / sampler.step_examples(progress.examples_in_epoch)
            with no_sync(model, sync=micro == micros):  # only the step's last micro-batch all-reduces
                with autocast(device, dtype):
                    loss = model(**batch).loss * weight
                scaler.scale(loss).backward()
            step_loss += loss.detach()
            if micro < micros:
                continue  # accumulate: the optimizer steps once per global batch
            # Every rank must see the same loss, to skip or stop together, and the same signal.
            world.sum(step_loss).div_(world.world_size)
            stopping = _agreed_signal(stop, world, device)  # read once: a later signal waits for the next step
            _step_unless_nonfinite(model, optimizer, scheduler, scaler, step_loss, plan, progress)
            examples = sampler.step_examples(progress.examples_in_epoch)
            tokens = sampler.step_tokens(progress.examples_in_epoch)
            window.add(step_loss, examples, tokens)
            step_loss.zero_()
            progress.step += 1
            progress.examples += examples
            progress.tokens += tokens
            progress.examples_in_epoch += examples
            micro, micros = 0, _micro_batches(sampler, progress, loader)
            if progress.examples_in_epoch == plan.examples_per_epoch:
                progress.epoch, progress.examples_in_epoch = progress.epoch + 1, 0
            window.step()
            bar.update()
            if progress.step % plan.log_every == 0:
                logged = window.flush(lr=scheduler.get_last_lr()[0],
                                      epoch=progress.epoch + progress.examples_in_epoch / plan.examples_per_epoch)
                if world.is_main:
                    _log(logged, progress.step, bar, tracker)
            progress.seconds = clock.training_seconds()
            with clock.paused(window):
                evaluation = None
                if progress.step % plan.eval_every == 0 or progress.step == plan.total_steps:
                    evaluation = evaluate_at(progress.step)
                    best = _keep_best(evaluation, best, tracker, world)
                if evaluation or progress.step % plan.checkpoint_every == 0 or stopping:
                    save(progress, best, evaluation)
            if stopping:
                raise Preempted(progress.step, stopping)
            if progress.step == plan.total_steps:
                break
    bar.close()
    assert best is not None  # the last step always evaluates
    progress.seconds = clock.training_seconds()
    return TrainResult(best=best, steps=progress.step, examples=progress.examples, tokens=progress.tokens,
                       seconds=progress.seconds)


def _micro_batches(sampler: EpochSampler, progress: Progress, loader: DataLoader) -> int:
    """This rank's micro-batches in the next optimizer step."""
    return math.ceil(sampler.share(progress.examples_in_epoch) / (loader.batch_size or 1))


def _agreed_signal(stop: StopRequest, world: World, device: torch.device) -> Optional[str]:
    """The signal that stops the run, if any rank got one: all ranks stop at the same step."""
    if not world.distributed:
        return stop.signal
    got = torch.tensor(float(signal.Signals[stop.signal]) if stop.signal else 0.0, device=device)
    torch.distributed.all_reduce(got, op=torch.distributed.ReduceOp.MAX)
    return signal.Signals(int(got.item())).name if got.item() else None


def _step_unless_nonfinite(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                           scheduler: torch.optim.lr_scheduler.LRScheduler, scaler: torch.amp.GradScaler,
                           step_loss: torch.Tensor, plan: Plan, progress: Progress) -> None:
    # Reading the loss waits for the device once per optimizer step (fp16's scaler already does).
    if bool(torch.isfinite(step_loss)):
        _optimizer_step(model, optimizer, scheduler, scaler, plan.max_grad_norm)
        return
    progress.nonfinite_steps += 1
    if progress.nonfinite_steps > plan.skip_nonfinite:
        raise NonFiniteLoss(progress.step + 1, float(step_loss))
    log.warning("step %d: the loss is %s; skipping this update (%d of train.skip_nonfinite=%d)",
                progress.step + 1, float(step_loss), progress.nonfinite_steps, plan.skip_nonfinite)
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()  # the schedule keeps time with the steps


def _log(logged: Dict[str, float], step: int, bar: tqdm, tracker: Tracker) -> None:
    bar.set_postfix(loss=f"{logged['train/loss']:.4f}", lr=f"{logged['train/lr']:.2e}",
                    ex_s=f"{logged['train/examples_per_second']:.0f}", refresh=False)
    tracker.log(logged, step=step)
    log.info("step %d: %s", step, ", ".join(f"{k.split('/')[1]}={v:.4g}" for k, v in logged.items()))


def _optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler, scaler: torch.amp.GradScaler,
                    max_grad_norm: float | None) -> None:
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)  # clip the true gradients, not the loss-scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def _keep_best(evaluation: Evaluation, best: Evaluation | None, tracker: Tracker, world: World) -> Evaluation:
    improved = best is None or evaluation.better_than(best)
    if not world.is_main:
        return evaluation if improved or best is None else best
    tracker.log({f"eval/{k}": v for k, v in evaluation.metrics.items()}, step=evaluation.step)
    log.info("step %d: %s%s", evaluation.step,
             ", ".join(f"{k}={v:.4f}" for k, v in evaluation.metrics.items()), " (best so far)" if improved else "")
    return evaluation if improved or best is None else best


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


class _Window:
    """Training loss and throughput since the last log, the loss summed on the device."""

    def __init__(self, device: torch.device) -> None:
        self._loss = torch.zeros((), device=device)
        self.restart()

    def restart(self) -> None:
        self._loss.zero_()
        self._examples, self._tokens, self._steps = 0, 0, 0
        self._start = time.perf_counter()

    def add(self, loss: torch.Tensor, examples: int, tokens: int) -> None:
        self._loss += loss  # no .item(): reading the loss would wait for the device
        self._examples += examples
        self._tokens += tokens

    def step(self) -> None:
        self._steps += 1

    def exclude(self, seconds: float) -> None:
        """Leave time spent outside training (evaluation, saving) out of the throughput."""
        self._start += seconds

    def flush(self, *, lr: float, epoch: float) -> Dict[str, float]:
        seconds = time.perf_counter() - self._start
        # Each step's loss is the mean over its global batch, averaged over the ranks.
        out = {"train/loss": self._loss.item() / max(self._steps, 1), "train/lr": lr,
               "train/examples_per_second": self._examples / max(seconds, 1e-9),
               "train/tokens_per_second": self._tokens / max(seconds, 1e-9), "train/epoch": epoch}
        self.restart()
        return out
