"""Which folder a search's trial writes (nli/sweep/search.py): its number in the study, unless a run of another
study already holds that folder in the sweep's directory. Through the real `train.py -m`, Hydra and Optuna."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest

from nli.sweep import report
from nli.sweep import table as sweep
from tests.support.runs import FAST, run_app


@pytest.mark.parametrize("study", ["moved aside", "in memory"])
def test_a_new_study_in_a_searchs_folder_leaves_the_earlier_studys_trials_and_runs_in_folders_of_its_own(
        tmp_path: Path, study: str) -> None:
    """A study begun anew where another ran (its optuna.db moved aside, as a refused study file's message advises; or
    a study kept in memory, the same command run again) numbers its trials from 0: trial 0 took the earlier trial
    0's folder, and failed on the run there ('holds a finished run with other settings'), or, drawn the same values,
    would have taken that run's results for its own."""
    sweep_dir = tmp_path / "search"
    search: List[str] = (["hparams_search=quickstart"] if study == "moved aside" else
                         ["hydra/sweeper=optuna", "optimizer.lr=tag(log,interval(1e-4,1e-2))"])
    args = ["-m", *FAST, *search, "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={sweep_dir}"]
    first = run_app(args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    (earlier,) = sweep.read_rows(sweep_dir)
    results = (Path(earlier["output_dir"]) / "results.json").read_text()
    if study == "moved aside":
        (sweep_dir / "optuna.db").rename(sweep_dir / "optuna.db.old")

    again = run_app(args, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "trial 0: " in again.stdout and "holds a run of another study" in again.stdout
    assert sweep.read_rows(sweep_dir)[0] == earlier
    (row,) = sweep.read_rows(sweep_dir)[1:]  # this command's
    assert row["state"] == sweep.COMPLETED and row["job"] == 1 and row["output_dir"] != earlier["output_dir"]
    assert json.loads((Path(row["output_dir"]) / "results.json").read_text())["status"] == "completed"
    assert (Path(earlier["output_dir"]) / "results.json").read_text() == results  # the earlier run as it was
    # Another study, under the same name and storage where its file was moved aside: its report leaves the earlier
    # study's trial out, as a sweep's run before it in the folder.
    notes: List[str] = []
    assert [(each["sweep"], each["job"]) for each in report.load_rows([sweep_dir], notes)] == [(row["sweep"], 1)]
    assert earlier["study"] != row["study"]
    assert notes == [f"{sweep_dir} holds the rows of 2 sweeps: the report is of the newest (sweep {row['sweep']}); "
                     f"the 1 rows of the older ones are left out (they stay in {sweep.RESULTS_JSONL})"]
