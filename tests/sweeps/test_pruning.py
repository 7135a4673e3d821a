"""Pruning (nli/sweep/pruning.py, nli.train.hooks.Pruning): a search's trials report each evaluation through
their run folders, and one the study's pruner gives up stops at its next evaluation, as early stopping stops
a run: ``status: pruned`` in its results.json, its row, the study and the report. Through the real
`train.py -m`, the real study and Optuna's own pruners."""

from __future__ import annotations

import json
import math
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import optuna
import pytest

from nli.errors import ConfigError
from nli.sweep import table as sweep
from nli.sweep.pruning import Watch
from nli.sweep.search import Settings
from tests.support.runs import FAST, ROOT, process_env, read_results, run_app

# Long enough that the sweeper, looking every 0.1 s, has read the first evaluation before the second.
LONG = [*FAST, "train.max_steps=200", "train.eval_every=10", "train.log_every=50"]


def trial_states(sweep_dir: Path) -> List[str]:
    with sqlite3.connect(sweep_dir / "optuna.db") as db:
        return [state for (state,) in db.execute("SELECT state FROM trials ORDER BY number")]


def test_a_pruned_trial_stops_at_its_next_evaluation_and_says_so_everywhere(tmp_path: Path) -> None:
    """The threshold pruner gives up every trial at its first report (no accuracy reaches 2): each stops at a
    later evaluation, its best checkpoint the model; the study has it PRUNED and names no best."""
    sweep_dir = tmp_path / "search"
    args = ["-m", *LONG, "hparams_search=quickstart", "hydra.sweeper.n_trials=2", "hydra/sweeper/pruner=threshold",
            "hydra.sweeper.pruner.lower=2.0", "hydra.sweeper.poll_interval=0.1", f"hydra.sweep.dir={sweep_dir}"]
    proc = run_app(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert trial_states(sweep_dir) == ["PRUNED", "PRUNED"]
    rows = sweep.read_rows(sweep_dir)
    assert [row["state"] for row in rows] == [sweep.PRUNED, sweep.PRUNED]
    for row in rows:
        folder = Path(row["output_dir"])
        results = read_results(folder)
        # Given up at step 10; the run reads prune.json right after writing each evaluation, so it ends at step 10
        # where the sweeper's poll falls in between (a CI run saw it), else at a later evaluation: never runs on.
        assert results["status"] == "pruned" and 10 <= results["pruned_at"] < 200
        assert results["train_steps"] == results["pruned_at"] and (folder / "model" / "config.json").is_file()
        assert json.loads((folder / "prune.json").read_text())["step"] == 10  # given up at its first report
        reported = [json.loads(line) for line in (folder / "evaluations.jsonl").read_text().splitlines()]
        assert [each["step"] for each in reported] == list(range(10, results["pruned_at"] + 1, 10))
        assert row["objective"] == results["objective"] == max(each["objective"] for each in reported)
    said = proc.stdout + proc.stderr
    assert "pruned by its search at step" in said and "no trial of study quickstart has completed" in said
    assert not (sweep_dir / "optimization_results.yaml").exists()  # a pruned trial is no study's best

    # The same command again: pruned trials are not resumed; one new trial, which no pruner stops.
    again = run_app([*args[:-4], f"hydra.sweep.dir={sweep_dir}", "hydra.sweeper.n_trials=1"], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert trial_states(sweep_dir) == ["PRUNED", "PRUNED", "COMPLETE"]
    assert "stopped before it ended" not in again.stdout + again.stderr
    new = sweep.read_rows(sweep_dir)[-1]
    assert new["state"] == sweep.COMPLETED and read_results(Path(new["output_dir"]))["status"] == "completed"
    assert new["output_dir"] not in {row["output_dir"] for row in rows}


def test_a_trial_that_ended_before_the_sweeper_looked_is_not_given_up_after_its_end(tmp_path: Path) -> None:
    """Runs shorter than hydra.sweeper.poll_interval: the sweeper's last look at each, after it ended, judged its
    evaluations, said the pruner gave it up ('it stops at its next evaluation') and wrote prune.json into the finished
    run's folder, where a continued run (more train.max_steps) would stop at once, pruned; the study had it
    complete."""
    sweep_dir = tmp_path / "search"
    proc = run_app(["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=2",
                    "hydra/sweeper/pruner=threshold", "hydra.sweeper.pruner.lower=2.0",
                    "hydra.sweeper.poll_interval=600", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert trial_states(sweep_dir) == ["COMPLETE", "COMPLETE"]
    assert "gave trial" not in proc.stdout + proc.stderr
    for row in sweep.read_rows(sweep_dir):
        folder = Path(row["output_dir"])
        assert (folder / "evaluations.jsonl").is_file() and not (folder / "prune.json").exists()
    with sqlite3.connect(sweep_dir / "optuna.db") as db:  # its evaluations reached the study all the same
        assert db.execute("SELECT COUNT(*) FROM trial_intermediate_values").fetchone()[0] == 4


def _study_trial(pruner: optuna.pruners.BasePruner) -> optuna.Trial:
    study = optuna.create_study(direction="maximize", pruner=pruner)
    return study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})


def test_a_pruned_run_run_again_ends_where_it_was_pruned_until_its_word_is_taken_back(tmp_path: Path) -> None:
    """A pruned run stopped after training (a signal in its final evaluation or export), or whose results.json was
    removed, resumes from its newest checkpoint: that it had been pruned was in no checkpoint, so it trained on to
    the next evaluation and ended pruned there, another run than the one the search gave up. prune.json deleted,
    as its log line says, it trains on."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "prune.json").write_text(json.dumps({"why": "below the median"}))
    args = [*FAST, f"hydra.run.dir={run_dir}"]  # evaluations at steps 6 and 12
    for attempt in range(2):
        proc = run_app(args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results = read_results(run_dir)
        assert (results["pruned_at"], results["train_steps"], results["status"]) == (6, 6, "pruned"), attempt
        (run_dir / "results.json").unlink()  # as a run stopped in its final phase leaves its folder
    (run_dir / "prune.json").unlink()
    proc = run_app(args, cwd=tmp_path)
    assert proc.returncode == 0 and "pruned at step 6, and" in proc.stdout and "is gone: training goes on" in \
        proc.stdout, proc.stdout + proc.stderr
    results = read_results(run_dir)
    assert results["train_steps"] == 12 and results["status"] == "completed" and "pruned_at" not in results


def test_the_watch_reports_each_new_evaluation_once_and_skips_a_line_being_written(tmp_path: Path) -> None:
    trial = _study_trial(optuna.pruners.NopPruner())
    (tmp_path / "evaluations.jsonl").write_text('{"step": 10, "objective": 0.5}\n{"step": 20, "obj')
    watch = Watch(interval=60)
    watch.add(trial, str(tmp_path))
    watch._look(watch.trials[trial.number])
    (tmp_path / "evaluations.jsonl").write_text('{"step": 10, "objective": 0.5}\n{"step": 20, "objective": 0.25}\n')
    watch.last(trial)
    assert trial.study.trials[0].intermediate_values == {10: 0.5, 20: 0.25}
    assert not (tmp_path / "prune.json").exists() and trial.number not in watch.trials


def test_a_trial_given_up_gets_prune_json_with_the_step_and_why(tmp_path: Path) -> None:
    trial = _study_trial(optuna.pruners.ThresholdPruner(lower=0.6))
    (tmp_path / "evaluations.jsonl").write_text('{"step": 10, "objective": 0.7}\n{"step": 20, "objective": NaN}\n')
    with Watch(interval=0.05) as watch:
        watch.add(trial, str(tmp_path))
        deadline = time.monotonic() + 30
        while not (tmp_path / "prune.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    told = json.loads((tmp_path / "prune.json").read_text())
    assert told["trial"] == trial.number and told["step"] == 20 and "step 20 (objective nan)" in told["why"]
    assert math.isnan(trial.study.trials[0].intermediate_values[20])


@pytest.mark.parametrize("settings, message", [
    ({"poll_interval": 0}, "hydra.sweeper.poll_interval=0.0 must be more than 0 seconds"),
    ({"storage": "journal:"}, "hydra.sweeper.storage=journal:: name the journal file"),
    ({"asynchronous": "maybe"}, "hydra.sweeper.asynchronous=maybe: Value 'maybe' is not a valid bool"),
    ({"poll_interval": "abc"}, "hydra.sweeper.poll_interval=abc: Value 'abc' of type 'str' could not be converted"),
])
def test_a_bad_pruning_or_storage_value_is_refused_by_its_key(settings: Dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.of(settings)


def test_a_journal_storage_is_optunas_journal_file_and_the_study_continues_from_it(tmp_path: Path) -> None:
    """``journal:<file>``: the storage Optuna recommends on a filesystem several machines share (NFS, Lustre)."""
    settings = Settings(storage=f"journal:{tmp_path / 'nfs' / 'study.journal'}", study_name="s")
    first = optuna.create_study(study_name="s", storage=settings.study_storage(), direction="maximize")
    first.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    assert isinstance(settings.study_storage(), optuna.storages.JournalStorage)
    again = optuna.load_study(study_name="s", storage=settings.study_storage())
    assert len(again.trials) == 2 and (tmp_path / "nfs" / "study.journal").stat().st_size > 0


@pytest.mark.process
def test_a_search_stopped_by_sigterm_in_its_first_trial_resumes_that_trials_folder(tmp_path: Path) -> None:
    """The same command again runs the stopped trial's values first: its folder continues from its checkpoint,
    the study counts one stopped (FAIL) and one complete trial, and n_trials=1 means the one resumed."""
    sweep_dir = tmp_path / "search"
    args = [str(ROOT / "train.py"), "-m", *FAST, "train.max_steps=300", "train.eval_every=50", "train.log_every=50",
            "hparams_search=quickstart", "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={sweep_dir}"]
    first = subprocess.Popen([sys.executable, *args], cwd=tmp_path, env=process_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not list(sweep_dir.glob("*/checkpoints/step-*/checkpoint.json")) and time.monotonic() < deadline:
        assert first.poll() is None, first.communicate()[0]
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    output, _ = first.communicate(timeout=120)
    assert first.returncode == 75, output  # preempted, resumable
    assert trial_states(sweep_dir) == ["RUNNING"]
    (folder,) = [path for path in sweep_dir.iterdir() if path.is_dir()]

    again = subprocess.run([sys.executable, *args], cwd=tmp_path, env=process_env(), capture_output=True, text=True,
                           timeout=300)
    said = again.stdout + again.stderr
    assert again.returncode == 0, said
    assert "trial 0 was stopped before it ended" in said and f"resuming from checkpoint {folder}/checkpoints" in said
    assert trial_states(sweep_dir) == ["FAIL", "COMPLETE"]
    assert [path for path in sweep_dir.iterdir() if path.is_dir()] == [folder]
    assert read_results(folder)["status"] == "completed" and read_results(folder)["train_steps"] == 300
    assert [row["output_dir"] for row in sweep.read_rows(sweep_dir)] == [str(folder)]
