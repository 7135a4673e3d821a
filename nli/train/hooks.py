"""What the training loop tells the rest of the run, and how the rest can end training early.

The loop calls every hook, in order, at five points: the start of training (after a resume's
restore), the end of each optimizer step, each evaluation, each checkpoint, and the end of
training. A hook overrides the methods it needs; one that wants training to end says why in
:meth:`Hook.stop_reason`, which the loop asks after each evaluation. Hooks with state to keep
register it with the checkpoint (nli.train.checkpoint).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from tqdm.auto import tqdm

from nli.contract import EVALUATIONS_FILE, PRUNE_FILE
from nli.evaluate.evaluation import Evaluation
from nli.io.storage import Storage
from nli.runtime.distributed import World
from nli.tracking.loggers import Trackers
from nli.train.checkpoint import BestEvaluation, Progress

log = logging.getLogger(__name__)


class Hook:
    """Does nothing at every point; subclasses override what they need."""

    def on_start(self, progress: Progress, best: BestEvaluation) -> None:
        """Before the first step of this attempt: ``progress`` and ``best`` as the checkpoint left them, if any."""

    def on_step_end(self, progress: Progress, logged: Optional[Mapping[str, float]]) -> None:
        """After each optimizer step; ``logged``: the training metrics, on steps that log them."""

    def on_evaluation(self, evaluation: Evaluation, *, improved: bool) -> None:
        """After each evaluation; ``improved``: it is the best so far."""

    def on_checkpoint(self, step: int, where: str) -> None:
        """After a checkpoint is written, whole."""

    def on_stop(self, progress: Progress, reason: str) -> None:
        """When training ends: ``completed``, ``stopped early``, or the signal that stopped it."""

    def stop_reason(self) -> Optional[str]:
        """Why training should end now, or None to go on."""
        return None


class Revisit(Hook):
    """Calls ``look`` after every step: a check that decides itself whether it is time to act (the
    CPU threads, nli.runtime.cpu)."""

    def __init__(self, look: Callable[[], None]) -> None:
        self.look = look

    def on_step_end(self, progress: Progress, logged: Optional[Mapping[str, float]]) -> None:
        self.look()


class SyncLogs(Hook):
    """The loggers' files copied to the bucket where they belong at every checkpoint and when training
    stops (nli.tracking.loggers): a job preempted after a checkpoint keeps what it had logged until then."""

    def __init__(self, trackers: Trackers) -> None:
        self.trackers = trackers

    def on_checkpoint(self, step: int, where: str) -> None:
        self.trackers.sync()

    def on_stop(self, progress: Progress, reason: str) -> None:
        self.trackers.sync()


class MetricsLog(Hook):
    """Training and evaluation metrics to the log and the loggers, on rank 0."""

    def __init__(self, trackers: Trackers, *, main: bool) -> None:
        self.trackers, self.main = trackers, main

    def on_step_end(self, progress: Progress, logged: Optional[Mapping[str, float]]) -> None:
        if logged is None or not self.main:
            return
        self.trackers.log(logged, step=progress.step)
        log.info("step %d: %s", progress.step, ", ".join(f"{k.split('/')[1]}={v:.4g}" for k, v in logged.items()))

    def on_evaluation(self, evaluation: Evaluation, *, improved: bool) -> None:
        if not self.main:
            return
        self.trackers.log({f"eval/{k}": v for k, v in evaluation.metrics.items()}, step=evaluation.step)
        log.info("step %d: %s%s", evaluation.step, ", ".join(f"{k}={v:.4f}" for k, v in evaluation.metrics.items()),
                 " (best so far)" if improved else "")


class ProgressBar(Hook):
    """tqdm's bar with the loss, learning rate and examples/s, on rank 0, where the output is a terminal:
    redrawn into a file (a log, Vertex AI's or Slurm's output) it would mix with the log's lines, which
    say the same every train.log_every steps."""

    def __init__(self, *, total: int, initial: int, enabled: bool) -> None:
        self.bar = tqdm(total=total, initial=initial, desc="train", disable=not (enabled and sys.stderr.isatty()),
                        dynamic_ncols=True, mininterval=0.1)

    def on_step_end(self, progress: Progress, logged: Optional[Mapping[str, float]]) -> None:
        if logged is not None:
            self.bar.set_postfix(loss=f"{logged['train/loss']:.4f}", lr=f"{logged['train/lr']:.2e}",
                                 ex_s=f"{logged['train/examples_per_second']:.0f}", refresh=False)
        self.bar.update()

    def on_stop(self, progress: Progress, reason: str) -> None:
        self.bar.close()


@dataclass(frozen=True)
class Judgement:
    """Early stopping's counters after a run of evaluations."""

    best: Optional[float] = None  # the best value of the metric, as early stopping counts it (min_delta)
    stale: int = 0  # evaluations since it last improved
    stopped_at: Optional[int] = None  # the step of the evaluation at which it ends training

    def after(self, step: int, value: float, *, patience: int, min_delta: float) -> "Judgement":
        """The counters once the evaluation of ``step`` has scored ``value``."""
        if self.best is None or (not math.isnan(value) and (math.isnan(self.best) or value > self.best + min_delta)):
            return Judgement(value, 0, self.stopped_at)
        stale = self.stale + 1
        stopped = self.stopped_at if self.stopped_at is not None or stale < patience else step
        return Judgement(self.best, stale, stopped)


def judge(history: Sequence[Tuple[int, float]], *, patience: int, min_delta: float) -> Judgement:
    """Early stopping's counters after the evaluations of ``history`` (step, value), in order: where a
    run with these settings stands, or would have stopped, at its last evaluation."""
    judgement = Judgement()
    for step, value in history:
        judgement = judgement.after(step, value, patience=patience, min_delta=min_delta)
    return judgement


class EarlyStopping(Hook):
    """Ends training once the task's main metric has not risen by more than ``min_delta`` for
    ``patience`` evaluations in a row. A resumed run judges the evaluations its checkpoint recorded
    again under this run's settings (a run continued with a new patience or min_delta goes on where
    a run started with them would), and one that had stopped stops again at once. Its counters are
    checkpoint state too: a checkpoint from before evaluations were recorded goes on counting from them."""

    def __init__(self, *, patience: int, min_delta: float, metric: str) -> None:
        self.patience, self.min_delta, self.metric = patience, min_delta, metric
        self.counters = Judgement()
        self.kept: Optional[BestEvaluation] = None  # the run's best evaluation: the model that stays

    @property
    def stopped_at(self) -> Optional[int]:
        """The step at which it ended training, if it did."""
        return self.counters.stopped_at

    def on_start(self, progress: Progress, best: BestEvaluation) -> None:
        self.kept = best
        if best.history is not None:
            self.counters = judge(best.history, patience=self.patience, min_delta=self.min_delta)

    def on_evaluation(self, evaluation: Evaluation, *, improved: bool) -> None:
        before = self.counters
        self.counters = before.after(evaluation.step, evaluation.objective, patience=self.patience,
                                     min_delta=self.min_delta)
        if before.stopped_at is None and self.counters.stopped_at is not None:
            kept = self.kept.evaluation if self.kept is not None else None
            best = (f"the best checkpoint, step {kept.step} ({self.metric}={kept.objective:.4f}), " if kept else
                    "the best so far ")
            log.info("step %d: stopping early: no improvement of %s in the last %d evaluations "
                     "(train.early_stopping.patience=%d, min_delta=%g); %sstays the model", evaluation.step,
                     self.metric, self.counters.stale, self.patience, self.min_delta, best)

    def stop_reason(self) -> Optional[str]:
        return None if self.stopped_at is None else f"stopped early at step {self.stopped_at}"

    def state_dict(self) -> Dict[str, Any]:
        return {"best": self.counters.best, "stale": self.counters.stale, "stopped_at": self.counters.stopped_at}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.counters = Judgement(state["best"], state["stale"], state["stopped_at"])


class Pruning(Hook):
    """A search's link to the trial it runs, through the run's folder (local, shared or gs://: a Vertex AI job
    cannot reach the study's storage). Each evaluation's objective goes into ``evaluations.jsonl``, rewritten
    whole (a bucket's objects take no appending), where the search's sweeper reads it (nli.sweep.pruning);
    once the study's pruner gives the trial up, the sweeper writes ``prune.json``, and training ends at the
    next evaluation, as early stopping ends it: the best checkpoint stays the model. Rank 0 reads the file
    and every rank follows its answer (all must stop at the same step)."""

    def __init__(self, storage: Storage, world: World) -> None:
        self.storage, self.world = storage, world
        self.history: List[Tuple[int, float]] = []
        self.pruned_at: Optional[int] = None  # the step at which it ended training, if it did

    def on_start(self, progress: Progress, best: BestEvaluation) -> None:
        self.history = list(best.history or [])  # a resumed run's evaluations up to its checkpoint
        if self.pruned_at is not None:  # pruned before it stopped: it ends there again, unless the word was taken back
            told = self.storage.read_json(PRUNE_FILE) if self.world.is_main else None
            if self.world.gather(told)[0] is None:
                log.info("pruned at step %d, and %s is gone: training goes on", self.pruned_at,
                         self.storage.describe(PRUNE_FILE))
                self.pruned_at = None

    def state_dict(self) -> Dict[str, Any]:
        return {"pruned_at": self.pruned_at}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.pruned_at = state["pruned_at"]

    def on_evaluation(self, evaluation: Evaluation, *, improved: bool) -> None:
        self.history.append((evaluation.step, evaluation.objective))
        told = None
        if self.world.is_main:
            self.storage.write_text(EVALUATIONS_FILE, "".join(
                json.dumps({"step": step, "objective": value}) + "\n" for step, value in self.history))
            told = self.storage.read_json(PRUNE_FILE)
        told = self.world.gather(told)[0]
        if told is not None and self.pruned_at is None:
            self.pruned_at = evaluation.step
            why = told.get("why") if isinstance(told, dict) else None
            log.info("step %d: pruned by the search (%s): training ends here; the best checkpoint stays the model "
                     "(%s says so: delete it to train this run on)", evaluation.step,
                     why or "its pruner gave the trial up", self.storage.describe(PRUNE_FILE))

    def stop_reason(self) -> Optional[str]:
        return None if self.pruned_at is None else f"pruned at step {self.pruned_at}"
