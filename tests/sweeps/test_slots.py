"""A search's trials in flight (nli/sweep/slots.py): under a launcher that runs jobs side by side, the next trial
starts as soon as one ends; under Hydra's basic launcher, one at a time. Through a real Hydra app whose jobs
take as long as their number says (tests/sweeps/timed_app.py), the project's sweeper and Hydra's launchers."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher

from nli.sweep.slots import Slots, kind
from tests.support.runs import FAST, ROOT, process_env
from tests.sweeps.test_local_gpus import alive

APP = Path(__file__).with_name("timed_app.py")


def timed_search(tmp_path: Path, *args: str) -> Dict[int, Dict[str, Any]]:
    """The timed app's search (4 trials, 2 at once: job 0 runs until the 3 others have ended, 120 s at most; the
    others 0.2 s each): each job's start and end."""
    return timed_search_said(tmp_path, *args)[0]


def timed_search_said(tmp_path: Path, *args: str) -> Tuple[Dict[int, Dict[str, Any]], str]:
    """:func:`timed_search`, and what the sweep wrote (its log)."""
    log = tmp_path / "jobs.jsonl"
    proc = subprocess.run([sys.executable, str(APP), "-m", f"log={log}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                           f"hydra.searchpath=[file://{ROOT / 'conf'}]", *args], cwd=tmp_path, env=process_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return jobs_of(log), proc.stdout + proc.stderr


def jobs_of(log: Path) -> Dict[int, Dict[str, Any]]:
    """Each job's lines of the timed app's log, as one: its start, pid and x, and its end once it ended."""
    jobs: Dict[int, Dict[str, Any]] = {}
    for line in log.read_text().splitlines():
        note = json.loads(line)
        jobs.setdefault(note["job"], {}).update(note)
    return jobs


@pytest.mark.process
@pytest.mark.parametrize("launcher", [
    ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],  # under hydra/launcher=local-gpus
    ["hydra/launcher=submitit_local"],  # a process per job, as on Slurm
], ids=["joblib", "submitit_local"])
def test_a_trial_starts_as_soon_as_a_slot_frees_not_when_its_batch_ends(tmp_path: Path, launcher: List[str]) -> None:
    """Job 0 runs until jobs 1 to 3 have ended: batched, jobs 2 and 3 would wait for job 0, the other half of the
    first batch, and job 0 would end at its 120 s limit, after job 1 alone."""
    jobs = timed_search(tmp_path, *launcher)
    assert sorted(jobs) == [0, 1, 2, 3]
    assert all(jobs[num]["ended"] < jobs[0]["ended"] for num in (1, 2, 3)), jobs
    assert jobs[1]["pid"] != jobs[0]["pid"]  # side by side


@pytest.mark.process
def test_under_the_basic_launcher_trials_run_one_at_a_time(tmp_path: Path) -> None:
    jobs = timed_search(tmp_path, "hydra/launcher=basic", "others=0", "long=0.2")
    order: List[Dict[str, float]] = sorted(jobs.values(), key=lambda job: job["started"])
    assert [job["job"] for job in order] == [0, 1, 2, 3]
    assert all(later["started"] >= earlier["ended"] for earlier, later in zip(order, order[1:]))


@pytest.mark.parametrize("launcher, expected", [
    ("hydra._internal.core_plugins.basic_launcher.BasicLauncher", "basic"),
    ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "apart"),
    ("hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher", "apart"),
    ("hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher", "apart"),
    ("hydra_plugins.vertex_launcher.vertex_launcher.VertexLauncher", "apart"),
])
def test_each_launcher_is_known_by_how_it_runs_trials(launcher: str, expected: str) -> None:
    found = {f"{each.__module__}.{each.__qualname__}": each for each in Plugins.instance().discover(Launcher)}
    assert kind(object.__new__(found[launcher])) == expected


@pytest.mark.process
def test_under_joblib_with_one_job_at_a_time_trials_run_one_at_a_time(tmp_path: Path) -> None:
    """Joblib with n_jobs=1 (local-gpus on a machine with no GPU, or one) runs the job in the calling thread: two
    trials launched at once from two threads trained side by side in the sweep's own process, one train.log
    holding both trials' lines, and one trial now and then failing on the other's Hydra state."""
    jobs, said = timed_search_said(tmp_path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=1", "others=0",
                                   "long=0.5", "short=0.5")
    order: List[Dict[str, float]] = sorted(jobs.values(), key=lambda job: job["started"])
    assert [job["job"] for job in order] == [0, 1, 2, 3]
    assert all(later["started"] >= earlier["ended"] for earlier, later in zip(order, order[1:])), order
    assert said.count("one at a time (hydra.launcher.n_jobs=1: joblib runs each in this process)") == 1, said


@pytest.mark.parametrize("n_jobs, expected, width", [(1, "basic", 1), (-1, "apart", 2), (2, "apart", 2),
                                                      (8, "apart", 4)])
def test_joblib_runs_no_more_trials_at_once_than_its_n_jobs(n_jobs: int, expected: str, width: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """hydra.sweeper.n_jobs=4 under joblib's n_jobs: past it, trials only queue in joblib's workers."""
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

    monkeypatch.setattr("os.cpu_count", lambda: 2)  # -1: every core, as joblib counts them
    launcher = JoblibLauncher(n_jobs=n_jobs, backend=None, prefer="processes")
    slots = Slots(launcher, 4)
    assert (kind(launcher), slots.width) == (expected, width)
    assert slots.describe().startswith("one at a time" if width == 1 else f"up to {width} at a time")


def test_a_launcher_it_does_not_know_gets_batches() -> None:
    class Elsewhere(Launcher):  # e.g. Ray's or RQ's: whether two launches at once are safe is not known
        def setup(self, **kwargs: object) -> None: ...

        def launch(self, job_overrides: object, initial_job_idx: int) -> list:
            return []

    assert kind(Elsewhere()) == "batched"


@pytest.mark.process
@pytest.mark.parametrize("launcher", [["hydra.launcher.n_jobs=2"], ["hydra/launcher=submitit_local"]],
                         ids=["joblib", "submitit_local"])
def test_ctrl_c_stops_every_trial_in_flight_and_the_same_command_runs_them_again(tmp_path: Path,
                                                                                 launcher: List[str]) -> None:
    """Ctrl-C reaches the sweep's main thread alone; each launch in flight ends as it would there (joblib
    stops its workers), the trials stay RUNNING in the study, and the same command again runs their values first.
    submitit's jobs trained on to their ends: Hydra's launcher holds them where the interrupted launch drops them."""
    log, study = tmp_path / "jobs.jsonl", f"sqlite:///{tmp_path / 'study.db'}"
    args = [sys.executable, str(APP), "-m", f"log={log}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
            f"hydra.searchpath=[file://{ROOT / 'conf'}]", *launcher, f"hydra.sweeper.storage={study}",
            "hydra.sweeper.study_name=timed", "hydra.sweeper.n_trials=2"]
    first = subprocess.Popen([*args, "others=0", "long=120", "short=120"], cwd=tmp_path, env=process_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while len(jobs_of(log) if log.exists() else {}) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    stopped = jobs_of(log)
    first.send_signal(signal.SIGINT)
    output, _ = first.communicate(timeout=60)
    assert first.returncode != 0 and len(stopped) == 2, output
    deadline = time.monotonic() + 10  # submitit's controller signals its task, and kills it a second later
    while [job["pid"] for job in stopped.values() if alive(job["pid"])] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [job["pid"] for job in stopped.values() if alive(job["pid"])], output  # no job left training
    assert all("ended" not in job for job in jobs_of(log).values())

    log.unlink()
    subprocess.run([*args, "others=0", "long=120", "short=120"], cwd=tmp_path, check=True, timeout=300,
                   env=process_env({"TIMED_LONG": "0.1", "TIMED_SHORT": "0.1"}), capture_output=True)
    again = jobs_of(log)
    assert sorted(job["x"] for job in again.values()) == sorted(job["x"] for job in stopped.values())
    with sqlite3.connect(tmp_path / "study.db") as db:
        states = [state for (state,) in db.execute("SELECT state FROM trials ORDER BY number")]
    assert states == ["FAIL", "FAIL", "COMPLETE", "COMPLETE"]


@pytest.mark.process
def test_asked_for_batches_each_batch_waits_for_its_slowest_trial(tmp_path: Path) -> None:
    jobs = timed_search(tmp_path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                        "hydra.sweeper.asynchronous=false", "others=0", "long=2")
    assert all(jobs[num]["started"] >= jobs[0]["ended"] for num in (2, 3)), jobs


@pytest.mark.process
def test_sigterm_to_a_search_stops_the_runs_of_its_trials_in_flight_with_their_checkpoints(tmp_path: Path) -> None:
    """SIGTERM to the sweep's process alone (a scheduler's, `kill`), as joblib's workers run two trials: the sweep
    ended with status 75 and its trials trained on to their ends, their folders held by runs no sweep would tell the
    study of. Each run is now passed the SIGTERM, and stops with its checkpoint, for the same command to resume."""
    sweep_dir = tmp_path / "search"
    first = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "-m", *FAST, "train.max_steps=3000",
                              "train.eval_every=20", "train.log_every=20", "hparams_search=quickstart",
                              "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2", "hydra/launcher=joblib",
                              "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep_dir}"],
                             cwd=tmp_path, env=process_env(), stdout=(tmp_path / "sweep.log").open("w"),
                             stderr=subprocess.STDOUT)
    runs: List[int] = []  # the runs' processes: joblib's workers, which this test started
    try:
        deadline = time.monotonic() + 240
        while len(list(sweep_dir.glob("*/checkpoints/step-*/checkpoint.json"))) < 2 and time.monotonic() < deadline:
            assert first.poll() is None, (tmp_path / "sweep.log").read_text()
            time.sleep(0.2)
        claims = sorted(sweep_dir.glob("*/.claim.json"))
        runs = [json.loads(claim.read_text())["pid"] for claim in claims]
        assert len(runs) == 2
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
        output = (tmp_path / "sweep.log").read_text()
        assert first.returncode == 75, output
        deadline = time.monotonic() + 30
        while [claim for claim in claims if claim.exists()] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [claim for claim in claims if claim.exists()], output  # no run trains on
        for folder in (claim.parent for claim in claims):
            assert "preempted, resumable: SIGTERM at step" in (folder / "train.log").read_text()
        with sqlite3.connect(sweep_dir / "optuna.db") as db:
            assert [state for (state,) in db.execute("SELECT state FROM trials")] == ["RUNNING", "RUNNING"]
    finally:
        for pid in runs:  # the workers, idle once their runs ended, or still training where they outlived the sweep
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if first.poll() is None:
            first.kill()
