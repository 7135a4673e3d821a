"""hydra/launcher=local-gpus (nli/sweep/local_gpus.py): a local parallel sweep gives each job GPUs of its own and queues
the rest. This machine may have no GPU: the sweep's process is told it sees two (CUDA_VISIBLE_DEVICES=0,1),
and the jobs, handed devices that do not exist, train on the CPU; what each was handed is in its row."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from itertools import combinations
from pathlib import Path

import pytest

from nli.sweep import local_gpus as gpus
from nli.sweep import table as sweep
from tests.support.runs import FAST, ROOT, process_env, run_app

TWO_GPUS = {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_each_job_has_a_gpu_of_its_own_and_the_third_waits_for_a_free_one(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = run_app(["-m", "hydra/launcher=local-gpus", *FAST, "seed=1,2,3", f"hydra.sweep.dir={sweep_dir}"],
                   cwd=tmp_path, env=TWO_GPUS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "local-gpus: 2 job(s) at once, each on 1 of the GPUs 0,1 (CUDA_VISIBLE_DEVICES=0,1)" in proc.stdout
    rows = sweep.read_rows(sweep_dir)
    assert sorted(row["job"] for row in rows) == [0, 1, 2] and {row["state"] for row in rows} == {"COMPLETED"}
    assert {row["gpus"] for row in rows} <= {"0", "1"}
    for first, second in combinations(rows, 2):  # two jobs that ran at the same time had GPUs of their own
        if first["started"] < second["ended"] and second["started"] < first["ended"]:
            assert first["gpus"] != second["gpus"], (first, second)
    *_, last = sorted(rows, key=lambda row: row["started"])
    before = [row for row in rows if row is not last]
    assert min(row["ended"] for row in before) <= last["started"]  # the third waited for a job to end ...
    assert last["gpus"] in {row["gpus"] for row in before if row["ended"] <= last["started"]}  # ... and took its GPU
    for row in rows:  # each job's log says what it was given
        log = (sweep_dir / str(row["job"]) / "train.log").read_text()
        assert f"CUDA_VISIBLE_DEVICES={row['gpus']} (process" in log and "device: cpu" in log


def test_a_worker_that_moves_to_another_sweep_lets_the_first_ones_slot_go(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool's worker (joblib keeps its workers between sweeps of one process) takes the same slot in the
    next sweep's directory and frees the one it held in the last: a sweep into that directory again takes it."""
    monkeypatch.setenv(gpus.MARKER, "1")
    monkeypatch.setenv(gpus.VISIBLE, "0,1")
    monkeypatch.setattr(gpus, "_LEASE", [])
    monkeypatch.setattr(gpus, "_SEEN", [])
    first = gpus.lease(tmp_path / "a", 1, worker=False)
    second = gpus.lease(tmp_path / "b", 1, worker=False)
    assert first is not None and second is not None and (first.slot, second.slot) == (0, 0)
    with open(tmp_path / "a" / gpus.SLOTS_DIR / "0.lock") as other:  # another process's attempt, as flock sees it
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raised BlockingIOError while the worker held it
    os.close(second.fd)


def test_more_jobs_at_once_than_gpu_slots_is_refused_before_any_job(tmp_path: Path) -> None:
    """A worker beyond the slots would wait for ever for a GPU the others hold."""
    sweep_dir = tmp_path / "sweep"
    proc = run_app(["-m", "hydra/launcher=local-gpus", "hydra.launcher.n_jobs=3", *FAST, "seed=1,2,3",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path, env=TWO_GPUS)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert ("error: hydra.launcher.n_jobs=3, but hydra/launcher=local-gpus has 2 GPU slot(s) of 1 GPU(s) (2 seen, "
            "CUDA_VISIBLE_DEVICES=0,1): leave n_jobs to the preset, or set it between 1 and 2") in proc.stderr
    assert not (sweep_dir / "0").exists()


def free(lock: Path) -> bool:
    """Whether another process could take the slot now."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.mark.process
def test_sigterm_to_the_sweep_stops_its_workers_and_frees_their_gpus(tmp_path: Path) -> None:
    """SIGTERM to the sweep's process alone: the workers, which would hold their GPUs for minutes, stop their
    jobs and end, and the next sweep finds every slot free (the lock files stay)."""
    sweep_dir = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=local-gpus", *FAST, "train.max_steps=100000", "seed=1,2,3",
            f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path,
                            env=process_env(TWO_GPUS), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    locks = [sweep_dir / gpus.SLOTS_DIR / f"{slot}.lock" for slot in (0, 1)]
    deadline = time.monotonic() + 240
    while not all(lock.exists() and lock.read_text() for lock in locks):  # both workers hold a GPU
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    workers = [int(lock.read_text().split()[1]) for lock in locks]
    assert not any(free(lock) for lock in locks)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75 and "stopped by SIGTERM" in output, output
    deadline = time.monotonic() + 240
    while any(alive(pid) for pid in workers):
        assert time.monotonic() < deadline, f"workers {workers} still run"
        time.sleep(0.1)
    assert all(lock.exists() and free(lock) for lock in locks)
    logs = "".join(path.read_text() for path in sweep_dir.glob("*/train.log"))
    assert logs.count(f"local-gpus: the sweep's process {proc.pid} is gone") >= 1


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
