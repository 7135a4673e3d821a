"""Hooks of the training loop (nli/train/hooks.py), early stopping first, and several loggers at once: on their
own, then end to end through the real train.py where a run is what they change."""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import List

import pytest

from nli.evaluate.evaluation import Evaluation
from nli.train.hooks import EarlyStopping
from tests.support.runs import FAST, read_results, run_app

# The metric cannot move: at this learning rate the weights barely change.
STALLED = [*FAST, "optimizer.lr=1e-9", "train.eval_every=2", "train.early_stopping.patience=2"]


def evaluations(*objectives: float) -> List[Evaluation]:
    return [Evaluation(step=10 * (i + 1), metrics={"accuracy": o}, objective=o) for i, o in enumerate(objectives)]


@pytest.mark.parametrize("objectives,patience,min_delta,stopped_at", [
    ((0.5, 0.6, 0.6, 0.6), 2, 0.0, 40),  # two evaluations without a rise
    ((0.5, 0.6, 0.55, 0.61), 2, 0.0, None),  # a rise resets the count
    ((0.5, 0.505, 0.509, 0.508), 3, 0.01, 40),  # rises smaller than min_delta do not count
    ((0.5, 0.505, 0.509, 0.511), 3, 0.01, None),  # ... but add up against the best
    ((math.nan, 0.3, math.nan, math.nan), 2, 0.0, 40),  # an undefined score is no improvement; a number is
    ((0.5, 0.4), 1, 0.0, 20),
])
def test_early_stopping_counts_evaluations_without_improvement(objectives: tuple, patience: int, min_delta: float,
                                                               stopped_at: int | None) -> None:
    hook = EarlyStopping(patience=patience, min_delta=min_delta, metric="accuracy")
    for evaluation in evaluations(*objectives):
        hook.on_evaluation(evaluation, improved=False)
    assert hook.stopped_at == stopped_at
    assert (hook.stop_reason() is None) == (stopped_at is None)
    again = EarlyStopping(patience=patience, min_delta=min_delta, metric="accuracy")
    again.load_state_dict(hook.state_dict())  # what a resumed run continues from
    assert json.dumps(again.state_dict()) == json.dumps(hook.state_dict())  # NaN-safe


def test_a_stalled_run_stops_early_and_says_so(tmp_path: Path) -> None:
    proc = run_app([*STALLED, f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(tmp_path)
    # Evaluations at steps 2, 4 and 6; 4 and 6 bring nothing new: stop at 6 of 12, export step 2.
    assert (results["stopped_early"], results["train_steps"], results["best_step"]) == (6, 6, 2)
    assert "step 6: stopping early: no improvement of accuracy in the last 2 evaluations" in \
        (tmp_path / "train.log").read_text()

    # Its counter is checkpoint state: with results.json lost (a crash before it was written), the
    # run resumes from step 6 and stops again at once, with the same results.
    (tmp_path / "results.json").unlink()
    again = run_app([*STALLED, f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming from checkpoint" in again.stdout + again.stderr
    assert "step 8:" not in (tmp_path / "train.log").read_text()  # no step after the stop
    resumed = read_results(tmp_path)
    assert {k: resumed[k] for k in ("stopped_early", "train_steps", "best_step", "accuracy")} == \
        {k: results[k] for k in ("stopped_early", "train_steps", "best_step", "accuracy")}


def test_without_patience_a_stalled_run_trains_to_the_end(tmp_path: Path) -> None:
    started = time.time()
    proc = run_app([*STALLED[:-1], "logger=[csv,tensorboard]", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Each row says when it was logged (Unix seconds, as TensorBoard's wall_time): the run's pace, its stalls.
    with open(tmp_path / "metrics.csv", newline="") as stream:
        times = [float(row["wall_time"]) for row in csv.DictReader(stream)]
    assert times == sorted(times) and started <= times[0] and times[-1] <= time.time()
    results = read_results(tmp_path)
    assert results["stopped_early"] is None and results["train_steps"] == 12
    # Two loggers at once, each from its own YAML file and class.
    with open(tmp_path / "metrics.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert [int(r["step"]) for r in rows if r["metric"] == "eval/accuracy"] == [2, 4, 6, 8, 10, 12]
    assert [int(r["step"]) for r in rows if r["metric"] == "train/loss"] == [3, 6, 9, 12]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/accuracy")] == [2, 4, 6, 8, 10, 12]
