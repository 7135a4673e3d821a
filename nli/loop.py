"""The training loop: mixed precision, gradient accumulation and clipping, periodic evaluation.

Plain PyTorch, top to bottom. The loss stays on the device between logs, so the hot loop never
waits for the GPU.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from nli import metrics
from nli.config import TaskConfig
from nli.device import autocast
from nli.tracking import Tracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """How much to train and how often to look, in optimizer steps."""

    total_steps: int
    accumulation: int  # micro-batches per optimizer step
    eval_every: int
    log_every: int
    max_grad_norm: float | None
    seed: int  # epoch e shuffles with seed + e

    @classmethod
    def make(cls, *, micro_batches_per_epoch: int, accumulation: int, epochs: float,
             max_steps: int | None, eval_every: int | None, log_every: int,
             max_grad_norm: float | None, seed: int) -> "Plan":
        steps_per_epoch = math.ceil(micro_batches_per_epoch / accumulation)
        total = max_steps or math.ceil(epochs * steps_per_epoch)
        return cls(total_steps=total, accumulation=accumulation, eval_every=eval_every or steps_per_epoch,
                   log_every=log_every, max_grad_norm=max_grad_norm, seed=seed)


@dataclass
class Evaluation:
    step: int
    metrics: Dict[str, float]  # GLUE names, with a suffix per extra split (accuracy_mm)
    objective: float  # the task's main metric on its main split

    def better_than(self, other: "Evaluation") -> bool:
        """Higher is better; an undefined score (NaN: a correlation of constant predictions)
        is worse than any number."""
        if math.isnan(other.objective):
            return not math.isnan(self.objective)
        return self.objective > other.objective


@dataclass
class TrainResult:
    best: Evaluation
    steps: int
    examples: int  # training examples processed
    seconds: float  # wall time in training steps, evaluation and saving excluded

    @property
    def examples_per_second(self) -> float:
        return self.examples / max(self.seconds, 1e-9)


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


def evaluate(model: torch.nn.Module, loaders: Mapping[str, DataLoader], task: TaskConfig, *,
             device: torch.device, dtype: torch.dtype, step: int) -> Evaluation:
    scores: Dict[str, float] = {}
    for split, loader in loaders.items():
        out = predict(model, loader, task, device=device, dtype=dtype)
        scores.update(metrics.compute(task.metrics, out.values, out.labels, suffix=task.eval_splits[split]))
    objective = scores[task.main_metric + task.eval_splits[task.main_split]]
    return Evaluation(step=step, metrics=scores, objective=objective)


def train(*, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          scheduler: torch.optim.lr_scheduler.LRScheduler, loader: DataLoader, generator: torch.Generator,
          evaluate_at: Callable[[int], Evaluation], on_best: Callable[[Evaluation], None], plan: Plan,
          device: torch.device, dtype: torch.dtype, tracker: Tracker, progress_bar: bool) -> TrainResult:
    """Run ``plan.total_steps`` optimizer steps; evaluate every ``plan.eval_every`` and at the end,
    calling ``on_best`` whenever the objective improves."""
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    model.train()
    step, epoch, examples = 0, 0, 0
    best: Evaluation | None = None
    window = _Window(device)
    paused = 0.0  # seconds spent evaluating and saving
    start = time.perf_counter()
    # Redrawn at most every 30 s when the output is a log file rather than a terminal.
    bar = tqdm(total=plan.total_steps, desc="train", disable=not progress_bar, dynamic_ncols=True,
               mininterval=0.1 if sys.stderr.isatty() else 30)
    while step < plan.total_steps:
        generator.manual_seed(plan.seed + epoch)  # the same data order for the same seed and epoch
        for micro, batch in enumerate(loader, start=1):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with autocast(device, dtype):
                loss = model(**batch).loss / plan.accumulation
            scaler.scale(loss).backward()
            window.add(loss.detach(), len(batch["labels"]))
            examples += len(batch["labels"])
            if micro % plan.accumulation and micro < len(loader):
                continue  # accumulate: the optimizer steps once per global batch
            # (An epoch's last step may hold fewer micro-batches; it steps with what it has.)
            _optimizer_step(model, optimizer, scheduler, scaler, plan.max_grad_norm)
            step += 1
            window.step()
            bar.update()
            if step % plan.log_every == 0:
                logged = window.flush(lr=scheduler.get_last_lr()[0], epoch=epoch + micro / len(loader))
                bar.set_postfix(loss=f"{logged['train/loss']:.4f}", lr=f"{logged['train/lr']:.2e}",
                                ex_s=f"{logged['train/examples_per_second']:.0f}", refresh=False)
                tracker.log(logged, step=step)
                log.info("step %d: %s", step, ", ".join(f"{k.split('/')[1]}={v:.4g}" for k, v in logged.items()))
            if step % plan.eval_every == 0 or step == plan.total_steps:
                pause = time.perf_counter()
                best = _evaluate_and_keep(evaluate_at(step), best, on_best, tracker)
                pause = time.perf_counter() - pause
                paused += pause
                window.exclude(pause)
            if step == plan.total_steps:
                break
        epoch += 1
    bar.close()
    assert best is not None  # the last step always evaluates
    return TrainResult(best=best, steps=step, examples=examples,
                       seconds=time.perf_counter() - start - paused)


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


def _evaluate_and_keep(evaluation: Evaluation, best: Evaluation | None,
                       on_best: Callable[[Evaluation], None], tracker: Tracker) -> Evaluation:
    tracker.log({f"eval/{k}": v for k, v in evaluation.metrics.items()}, step=evaluation.step)
    improved = best is None or evaluation.better_than(best)
    log.info("step %d: %s%s", evaluation.step,
             ", ".join(f"{k}={v:.4f}" for k, v in evaluation.metrics.items()), " (best so far)" if improved else "")
    if improved:
        on_best(evaluation)
        return evaluation
    assert best is not None
    return best


class _Window:
    """Training loss and throughput since the last log, the loss summed on the device."""

    def __init__(self, device: torch.device) -> None:
        self._loss = torch.zeros((), device=device)
        self.restart()

    def restart(self) -> None:
        self._loss.zero_()
        self._examples, self._steps = 0, 0
        self._start = time.perf_counter()

    def add(self, loss: torch.Tensor, examples: int) -> None:
        self._loss += loss  # no .item(): reading the loss would wait for the device
        self._examples += examples

    def step(self) -> None:
        self._steps += 1

    def exclude(self, seconds: float) -> None:
        """Leave time spent outside training (evaluation, saving) out of the throughput."""
        self._start += seconds

    def flush(self, *, lr: float, epoch: float) -> Dict[str, float]:
        seconds = time.perf_counter() - self._start
        # Each step's micro-losses were divided by the accumulation, so they sum to its mean loss.
        out = {"train/loss": self._loss.item() / max(self._steps, 1), "train/lr": lr,
               "train/examples_per_second": self._examples / max(seconds, 1e-9), "train/epoch": epoch}
        self.restart()
        return out
