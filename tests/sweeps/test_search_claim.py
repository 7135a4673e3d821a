"""One command at a time on a study (nli/sweep/search.py): a search claims its study's file while it runs. Through the
real `train.py -m`, Hydra and Optuna, the first search a process of its own."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from tests.support.runs import FAST, ROOT, process_env, run_app


def states(db: Path) -> List[str]:
    with sqlite3.connect(db) as connection:
        return [state for (state,) in connection.execute("SELECT state FROM trials ORDER BY number")]


@pytest.mark.process
def test_a_second_search_of_a_study_another_search_runs_is_refused_and_leaves_its_trials_alone(tmp_path: Path) -> None:
    """Two searches of one study kept outside their sweep folders (a shared optuna.db): the second took the first's
    running trial for a stopped one, failed it in the study and ran it again in its own folder, and the first then
    crashed as it told the study its trial's end ('Cannot tell a FAIL trial')."""
    db = tmp_path / "studies" / "optuna.db"
    db.parent.mkdir()
    args = ["-m", *FAST, "train.max_steps=300", "train.eval_every=50", "train.log_every=50",
            "hparams_search=quickstart", "hydra.sweeper.n_trials=1", f"hydra.sweeper.storage=sqlite:///{db}"]
    first = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, f"hydra.sweep.dir={tmp_path / 'one'}"],
                             cwd=tmp_path, env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        deadline = time.monotonic() + 240
        while not list((tmp_path / "one").glob("*/checkpoints/step-*/checkpoint.json")) and time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()[0]
            time.sleep(0.2)
        assert states(db) == ["RUNNING"]

        second = run_app([*args, f"hydra.sweep.dir={tmp_path / 'two'}"], cwd=tmp_path)
        assert second.returncode == 1, second.stdout + second.stderr
        assert second.stderr.strip().splitlines()[-1].startswith(
            f"error: hydra.sweeper.storage=sqlite:///{db}: the study quickstart is in use by another search: host ")
        assert f"pid {first.pid}," in second.stderr and "give this search another hydra.sweeper.study_name" in \
            second.stderr
        assert states(db) == ["RUNNING"] and not list((tmp_path / "two").glob("*/config.yaml"))
    finally:
        first.send_signal(signal.SIGTERM)
        output, _ = first.communicate(timeout=120)
    assert first.returncode == 75, output  # stopped as a search stops, not a crash
    assert states(db) == ["RUNNING"]  # for the same command to resume

    again = run_app([*args, f"hydra.sweep.dir={tmp_path / 'one'}"], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr  # the claim was let go
    assert states(db) == ["FAIL", "COMPLETE"]
