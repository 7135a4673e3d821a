"""Sweeps as researchers run them (nli/sweep/table.py): every launcher's table, failed jobs that do not stop
the sweep, seeds summed up, Optuna searches that continue, one sweep at a time in a directory, and a
sweep run again whose table is its own. Through the real `train.py -m`."""

from __future__ import annotations

import csv
import json
import logging
import math
import multiprocessing
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from itertools import product
from pathlib import Path
from typing import Any, Dict, List, Tuple

import optuna
import pytest
import yaml

from nli.io.claim import HOST, Owner
from nli.sweep import report
from nli.sweep import table as sweep
from tests.support.diskfull import full, needs_full
from tests.support.glue_layouts import stsb_with_one_gold_score
from tests.support.runs import FAST, GLUE_DATA, ROOT, process_env, read_results, run_app, shared_folder
from tests.support.wandb_records import records

# A job that fails as it starts, for a reason its config cannot tell (the schema's rules stop the sweep before any
# job: tests/nli/config/test_keys.py): its checkpoint folder's parent is a file. Relative to the sweep's cwd.
BLOCKED = "a-file/checkpoints"


def blocked_error(cwd: Path) -> str:
    """The error of a job given ``BLOCKED``, run in ``cwd``."""
    return (f"train.checkpoint_dir={BLOCKED}: {cwd / 'a-file'} is a file, not a folder. Set train.checkpoint_dir to "
            "a folder")


def blocker(cwd: Path) -> Path:
    """The file that stands where :data:`BLOCKED`'s parent folder would be."""
    path = cwd / "a-file"
    path.write_text("not a folder")
    return path


SWEEP_CLAIM = sweep.CLAIM.file


def rows_by_job(sweep_dir: Path) -> Dict[int, Dict[str, Any]]:
    """The rows of the directory's newest sweep, by job number."""
    rows, _ = sweep.newest_sweep(sweep.read_rows(sweep_dir))
    assert len({row["job"] for row in rows}) == len(rows)  # one row per job
    return {row["job"]: row for row in rows}


@needs_full
def test_a_table_the_disk_will_not_take_after_the_rows_were_kept_is_a_warning(tmp_path: Path) -> None:
    """Job 0's row was kept in sweep_results.jsonl and its sweep_results.csv would not write (the disk full): the sweep
    said the row could not be added, ended 1, and left its staging file behind. Now a warning, the next write makes
    the table whole, and the sweep, whose jobs all ran, ends 0."""
    sweep_dir = tmp_path / "sweep"
    staging = full(sweep_dir / f".sweep_results.csv.{os.getpid()}")  # where the sweep writes its table first
    proc = run_app(["-m", *FAST, "seed=1,2", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warned = [line for line in proc.stdout.splitlines() if "could not be written" in line]
    assert len(warned) == 1 and f"{sweep_dir / 'sweep_results.csv'} could not be written (No space left on device), " \
        f"and is removed rather than left out of date: every row is in {sweep_dir / 'sweep_results.jsonl'}" in warned[0]
    assert "could not be added" not in proc.stdout + proc.stderr and "Traceback" not in proc.stdout + proc.stderr
    assert sorted(rows_by_job(sweep_dir)) == [0, 1]
    assert len(list(csv.DictReader((sweep_dir / "sweep_results.csv").open()))) == 2
    assert not staging.is_symlink() and not [path.name for path in sweep_dir.glob(".sweep_results.csv.*")]


def test_a_failed_job_is_a_row_the_others_run_and_the_sweep_exits_non_zero(tmp_path: Path) -> None:
    blocker(tmp_path)
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *FAST, f"hydra.sweep.dir={sweep_dir}"]
    proc = run_app([*args, f"train.checkpoint_dir={BLOCKED},null"], cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    rows = rows_by_job(sweep_dir)
    assert rows[0]["state"] == "FAILED" and blocked_error(tmp_path) in rows[0]["error"] and "objective" not in rows[0]
    assert rows[1]["state"] == "COMPLETED" and rows[1]["train.checkpoint_dir"] == "null" and rows[1]["error"] is None
    results = read_results(sweep_dir / "1")  # the job after the failed one ran to the end
    assert rows[1]["objective"] == results["objective"] and rows[1]["train_seconds"] == results["train_seconds"]
    assert rows[1]["output_dir"] == str(sweep_dir / "1")
    assert "gpu_hours" not in rows[1] and "The sweep used" not in output  # a CPU job has no GPU-hours (nli.sweep.cost)
    # The end of the output: the table, then the failed job by number and overrides, with its error.
    table = proc.stdout[proc.stdout.index("Sweep results"):]
    failed = table[table.index("1 of the sweep's jobs failed (the others ran):"):].splitlines()
    assert failed[1].startswith("  #0 experiment=quickstart ")
    assert f"train.checkpoint_dir={BLOCKED}: error: {blocked_error(tmp_path)}" in failed[1]
    assert "Traceback" not in output
    # stderr, where a single run's error goes, says the sweep failed (it was empty: the list is on stdout)
    assert proc.stderr.strip().splitlines()[-1] == ("error: 1 of the sweep's jobs failed: the lines above say which "
                                                    f"and why ({sweep_dir / 'sweep_results.csv'})"), proc.stderr
    assert (sweep_dir / "sweep_results.csv").read_text().count("\n") == 3  # header and two rows
    # Where the jobs wrote, as the table has it (a search's trial=<n>, a Vertex AI job's bucket folder), not a form.
    assert (f"  jobs     {sweep_dir / '1'} (results.json, model/, eval_predictions/, train.log), and each job's in "
            "the table's output_dir column\n") in proc.stdout  # one that ran: job 0 has its train.log alone

    first = rows

    # The same sweep again with job 0 mended: a table of its own, job 1 answering from its finished folder.
    # With W&B (offline): job 0's run tagged with its overrides, and the table as a run of the sweep's group.
    again = run_app([*args, "train.checkpoint_dir=checkpoints,null", "logger=wandb", "logger.wandb.mode=offline"],
                    cwd=tmp_path, env={"WANDB_SILENT": "true"})
    assert again.returncode == 0, again.stdout + again.stderr
    rows = rows_by_job(sweep_dir)
    assert [rows[job]["state"] for job in (0, 1)] == ["COMPLETED", "COMPLETED"]
    assert rows[0]["train.checkpoint_dir"] == "checkpoints" and rows[1]["objective"] == results["objective"]
    assert rows[0]["sweep"] == rows[1]["sweep"] != first[0]["sweep"] == first[1]["sweep"]
    assert sweep.read_rows(sweep_dir) == [first[0], first[1], rows[0], rows[1]]  # the first sweep's kept as they were
    configs = {job: yaml.safe_load((sweep_dir / job / "config.yaml").read_text()) for job in ("0", "1")}
    assert {c["train"]["checkpoint_dir"] for c in configs.values()} == {"checkpoints", None}

    job_run = wandb_run(sweep_dir / "0")
    assert "train.checkpoint_dir=checkpoints" in job_run.tags and job_run.run_group == "sweep"
    assert json.loads(next(item.value_json for item in job_run.config.update if item.key == "overrides"))[
        "train.checkpoint_dir"] == "checkpoints"
    summary_run = wandb_run(sweep_dir)
    assert (summary_run.run_group, summary_run.job_type) == ("sweep", "sweep-summary")
    (table,) = sweep_dir.glob("wandb/offline-run-*/files/media/table/sweep_results_*.table.json")
    logged = json.loads(table.read_text())
    objectives = [line[logged["columns"].index("objective")] for line in logged["data"]]
    assert objectives == [rows[0]["objective"], rows[1]["objective"]]


def wandb_run(folder: Path) -> Any:
    """The run record of the one offline W&B run under ``folder``."""
    (path,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    return next(record.run for record in records(path) if record.WhichOneof("record_type") == "run")


def test_a_mistake_every_job_would_make_stops_the_sweep_before_any_job(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = run_app(["-m", *FAST, "optimizer.lrr=1e-3", "seed=1,2", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error: optimizer.lrr is not a key of this config: did you mean optimizer.lr?" in proc.stderr
    assert not (sweep_dir / "0").exists() and sweep.read_rows(sweep_dir) == []


@pytest.mark.process
def test_submitit_local_rows_from_each_job_and_seeds_summed_up(tmp_path: Path) -> None:
    """Four jobs at once in their own processes, each writing its row; two fail."""
    blocked = blocker(tmp_path) / "checkpoints"  # absolute: submitit's jobs run in folders of their own
    sweep_dir = tmp_path / "sweep"
    proc = run_app(["-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", *FAST,
                    f"train.checkpoint_dir=null,{blocked}", "seed=1,2", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    rows = sweep.read_rows(sweep_dir)
    assert sorted(row["job"] for row in rows) == [0, 1, 2, 3]
    good = [row for row in rows if row["train.checkpoint_dir"] == "null"]  # as Hydra hands a swept value to the job
    assert [row["state"] for row in good] == ["COMPLETED"] * 2
    error = f"train.checkpoint_dir={blocked}: {blocked.parent} is a file, not a folder"
    assert all(row["state"] == "FAILED" and error in row["error"]
               for row in rows if row not in good)
    assert "2 of the sweep's jobs failed" in output

    with open(sweep_dir / sweep.SUMMARY_CSV) as stream:
        groups = {group["train.checkpoint_dir"]: group for group in csv.DictReader(stream)}
    objectives = [row["objective"] for row in good]
    speeds = [row["train_examples_per_second"] for row in good]
    assert groups["null"]["n"] == "2" and groups["null"]["failed"] == "0"
    assert sorted(groups["null"]["seeds"].split()) == ["1", "2"]
    assert float(groups["null"]["objective_mean"]) == pytest.approx(statistics.mean(objectives))
    assert float(groups["null"]["objective_sd"]) == pytest.approx(statistics.stdev(objectives))
    assert float(groups["null"]["train_examples_per_second_sd"]) == pytest.approx(statistics.stdev(speeds))
    assert groups[str(blocked)]["n"] == "0" and groups[str(blocked)]["failed"] == "2"
    assert "Over seeds" in output


# ------------------------------------------------------------------- one sweep at a time in a directory


def start_sweep(args: List[str], *, cwd: Path, sweep_dir: Path) -> subprocess.Popen:
    """`python train.py -m ARGS` in its own process, returned once it holds ``sweep_dir``: its claim written
    whole (the file is created first, then filled: a process stopped in between holds a claim that names no one)."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "-m", *args, f"hydra.sweep.dir={sweep_dir}"],
                            cwd=cwd, env=process_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not _claim_written(sweep_dir / SWEEP_CLAIM):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    return proc


def _claim_written(path: Path) -> bool:
    try:
        return "pid" in json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet, or created and not yet filled
        return False


@pytest.mark.process
def test_a_second_sweep_into_a_directory_a_live_sweep_holds_is_refused_before_any_job(tmp_path: Path) -> None:
    """Two sweeps at once into one directory: the second stops at its start, naming the first; the first,
    with a job that fails, runs to its end with a table of its own jobs and lets the directory go."""
    blocker(tmp_path)
    sweep_dir = tmp_path / "sweep"
    first = start_sweep([*FAST, f"train.checkpoint_dir=null,{BLOCKED}"], cwd=tmp_path, sweep_dir=sweep_dir)
    os.kill(first.pid, signal.SIGSTOP)  # alive and holding the directory, whatever the speed of the machine
    try:
        second = run_app(["-m", *FAST, "optimizer.lr=3e-3,5e-4", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    output, _ = first.communicate(timeout=300)

    assert second.returncode == 1 and "Traceback" not in second.stdout + second.stderr
    refusal = second.stderr.strip()
    assert "\n" not in refusal, refusal  # one line
    assert re.fullmatch(rf"error: {re.escape(str(sweep_dir))} is in use by another sweep: host {HOST}, pid "
                        rf"{first.pid}, started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(heartbeat \d+ s ago\)\. "
                        r"Wait for it to end, give this sweep another hydra\.sweep\.dir, or, if that sweep is gone, "
                        rf"delete {re.escape(str(sweep_dir / SWEEP_CLAIM))}", refusal)
    assert "Launching" not in second.stdout  # no job of the second sweep started

    assert first.returncode == 1, output  # its own failed job
    rows = sweep.read_rows(sweep_dir)
    assert [(row["job"], row["train.checkpoint_dir"], row["state"]) for row in rows] == [
        (0, "null", "COMPLETED"), (1, BLOCKED, "FAILED")]
    assert rows[0]["objective"] == read_results(sweep_dir / "0")["objective"] and "objective" not in rows[1]
    assert yaml.safe_load((sweep_dir / "0" / "config.yaml").read_text())["optimizer"]["lr"] == 1e-3
    assert sorted(path.name for path in sweep_dir.iterdir() if path.is_dir()) == ["0", "1"]
    assert f"train.checkpoint_dir=null,{BLOCKED}" in (sweep_dir / "multirun.yaml").read_text()  # the second's: none
    table = output[output.index("Sweep results"):]
    assert "0.003" not in table and "0.0005" not in table
    assert not (sweep_dir / SWEEP_CLAIM).exists()  # let go at its end, a failed job and all


@pytest.mark.process
def test_a_sweep_killed_outright_leaves_a_directory_the_next_sweep_takes_over(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    killed = start_sweep([*FAST, "optimizer.lr=1e-3,5e-4"], cwd=tmp_path, sweep_dir=sweep_dir)
    killed.kill()
    killed.communicate(timeout=60)
    assert Owner.decode((sweep_dir / SWEEP_CLAIM).read_bytes()).pid == killed.pid  # type: ignore[union-attr]

    proc = run_app(["-m", *FAST, "optimizer.lr=3e-3", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"pid {killed.pid} no longer runs on {HOST}. Taking it over" in proc.stdout
    assert [(row["job"], row["optimizer.lr"]) for row in sweep.read_rows(sweep_dir)] == [(0, "0.003")]
    assert not (sweep_dir / SWEEP_CLAIM).exists()


@pytest.mark.process
def test_sigterm_to_a_sweep_lets_its_directory_go(tmp_path: Path) -> None:
    """SIGTERM as the sweep starts, before any job has a handler of its own: a stop (75) that leaves the
    directory to the next sweep at once."""
    sweep_dir = tmp_path / "sweep"
    proc = start_sweep([*FAST, "optimizer.lr=1e-3,5e-4"], cwd=tmp_path, sweep_dir=sweep_dir)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75 and "stopped by SIGTERM" in output and "Traceback" not in output, output
    assert not (sweep_dir / SWEEP_CLAIM).exists()


@pytest.mark.process
def test_ctrl_c_as_a_sweep_starts_is_one_line_and_lets_its_directory_go(tmp_path: Path) -> None:
    """SIGINT as the sweep starts: between jobs Python's KeyboardInterrupt (exit 130), inside the first job
    the run's own stop (75); either way one line, no traceback, and the directory let go."""
    sweep_dir = tmp_path / "sweep"
    proc = start_sweep([*FAST, "optimizer.lr=1e-3,5e-4"], cwd=tmp_path, sweep_dir=sweep_dir)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode in (75, 130) and "Traceback" not in output, output
    assert "interrupted (Ctrl-C)" in output if proc.returncode == 130 else "stopped by SIGINT" in output
    assert not (sweep_dir / SWEEP_CLAIM).exists()


# train.py -m with Ctrl-C sent to itself at one point of a sweep whose jobs run in its own process (Hydra's basic
# launcher), where Python's KeyboardInterrupt was lost or became another error: inside Hydra's reading of a config
# file as it composes job 0 (its `finally` closes a file not yet opened: UnboundLocalError, exit 1, a traceback); in
# a __del__ the signal interrupts once the sweep holds its directory ("Exception ignored": the sweep ran on, exit 0);
# as job 0's run starts, before its own handler; after job 0, before job 1.
CTRL_C_AT = """
import os, pathlib, runpy, signal, sys
import nli.runtime.platform, nli.sweep.table as table
point, sys.argv = sys.argv[1], sys.argv[2:]
def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    sum(range(3))  # the handler runs at the next call: here
def after(owner, name, send):
    step = getattr(owner, name)
    def wrapped(*args, **kwargs):
        result = step(*args, **kwargs)
        send()
        return result
    setattr(owner, name, wrapped)
class Dropped:
    def __del__(self):
        ctrl_c()
if point == "hydra-reads-a-config":
    opened = pathlib.Path.open
    def open_(self, *args, **kwargs):
        if table._HELD and sys._getframe(1).f_code.co_name == "_read_config":
            pathlib.Path.open = opened
            ctrl_c()
        return opened(self, *args, **kwargs)
    pathlib.Path.open = open_
elif point == "a-__del__":
    after(table, "hold", lambda: Dropped())
elif point == "as-the-run-starts":
    after(nli.runtime.platform, "detect", ctrl_c)
elif point == "between-jobs":
    after(table.SweepResults, "on_job_end", ctrl_c)
elif point == "sigterm-between-trials":  # as a search asks for its next trial, the last one told
    import nli.sweep.search as search
    asked = search.OptunaSearch._asked
    def next_trial(self, study, space, fixed, jobs):
        if jobs:
            os.kill(os.getpid(), signal.SIGTERM)
        return asked(self, study, space, fixed, jobs)
    search.OptunaSearch._asked = next_trial
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.process
@pytest.mark.parametrize("point", ["hydra-reads-a-config", "a-__del__", "as-the-run-starts", "between-jobs"])
def test_ctrl_c_anywhere_in_a_sweep_stops_it_in_one_line(tmp_path: Path, point: str) -> None:
    """Between the jobs of a sweep that runs them itself, Ctrl-C is held, not raised where it lands, and acted on
    where the sweep can stop cleanly: the next job's start (130), or the run that has begun (its own stop, 75)."""
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-c", CTRL_C_AT, point, str(ROOT / "train.py"), "-m", *FAST,
                           "optimizer.lr=1e-3,5e-4", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path, env=process_env(),
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    output = proc.stdout
    assert "Traceback" not in output and "Exception ignored" not in output, output
    if point == "as-the-run-starts":
        assert proc.returncode == 75, output
        assert output.strip().splitlines()[-1].startswith("stopped by SIGINT before training began")
    else:
        assert proc.returncode == 130 and "interrupted (Ctrl-C)" in output.splitlines(), output
    finished = [job for job in ("0", "1") if (sweep_dir / job / "results.json").exists()]
    assert finished == (["0"] if point == "between-jobs" else []), output  # no job began after the Ctrl-C
    assert not (sweep_dir / SWEEP_CLAIM).exists()


@pytest.mark.process
@pytest.mark.parametrize("point, status", [("between-jobs", 130), ("sigterm-between-trials", 75)])
def test_a_search_stopped_between_trials_keeps_its_best_so_far(tmp_path: Path, point: str, status: int) -> None:
    """optimization_results.yaml was written only at a search's clean end: one stopped by Ctrl-C or SIGTERM after a
    trial had completed left none. And SIGTERM, which ends the sweep at once, left the search's claim of its study
    behind: the same command again warned of a search that held it and was gone, and took it over."""
    sweep_dir = tmp_path / "search"
    proc = subprocess.run([sys.executable, "-c", CTRL_C_AT, point, str(ROOT / "train.py"), "-m", *FAST,
                           "hparams_search=quickstart", "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep_dir}"],
                          cwd=tmp_path, env=process_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=300)
    assert proc.returncode == status and "Traceback" not in proc.stdout, proc.stdout
    [row] = sweep.read_rows(sweep_dir)  # trial 0's; the stop came before trial 1 began
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert row["state"] == "COMPLETED" and best["best_value"] == row["objective"], proc.stdout
    assert not (sweep_dir / SWEEP_CLAIM).exists() and not list(sweep_dir.glob(".optuna.db.*.claim.json"))  # let go
    # Its table so far, as the docs say a sweep SIGTERM stops ends (a Ctrl-C's is its end's own): trial 0's row.
    table = proc.stdout[proc.stdout.index("Sweep results"):].splitlines()[1:3]
    assert [line.split()[:2] for line in table] == [["job", "state"], ["0", "COMPLETED"]], proc.stdout
    # Its report says that it stopped: it was read as a search of one trial.
    notes: List[str] = []
    assert [each["ended"] for each in report.load_rows([sweep_dir], notes)] == [row["ended"]]
    assert notes == [f"{sweep_dir}: 1 of the 3 trials of the search's last command have ended, and the report is of "
                     "those: the others never ended (the search was stopped, or they still run under a launcher "
                     "elsewhere); the same command again continues its study, first resuming a trial stopped mid-way, "
                     "if any"]


RERUN = (["-m", *FAST, "optimizer.lr=1e-3,3e-3"], ["-m", *FAST, "optimizer.lr=1e-3,5e-4"])


def rerun_sweep(root: Path) -> Path:
    """Two sweeps, one after the other, into one directory: the second with other overrides. Its job 0
    (lr 1e-3) answers from the first's finished folder; its job 1 (lr 5e-4) finds folder 1 holding the
    first's lr 3e-3 run, and is refused. Shared (read only) with tests/sweeps/test_report.py."""

    def make(sweep_dir: Path) -> None:
        for args, status in zip(RERUN, (0, 1)):
            proc = run_app([*args, f"hydra.sweep.dir={sweep_dir}"], cwd=root)
            assert proc.returncode == status, proc.stdout + proc.stderr
            (sweep_dir / f"output-{status}.txt").write_text(proc.stdout + proc.stderr)

    return shared_folder(root, "rerun-sweep", [" ".join(args) for args in RERUN], make)


def test_a_sweep_run_again_with_other_overrides_has_a_table_of_its_own_jobs(shared_root: Path) -> None:
    sweep_dir = rerun_sweep(shared_root)
    every = sweep.read_rows(sweep_dir)
    first, second = every[:2], every[2:]
    assert [row["optimizer.lr"] for row in first] == ["0.001", "0.003"] and len(second) == 2
    assert len({row["sweep"] for row in first}) == len({row["sweep"] for row in second}) == 1
    assert first[0]["sweep"] != second[0]["sweep"] and first[0]["sweep_started"] < second[0]["sweep_started"]

    # The second sweep's table: its two jobs, job 1 refused without the results its folder holds (lr 3e-3's).
    assert [(row["job"], row["optimizer.lr"], row["state"]) for row in second] == [(0, "0.001", "COMPLETED"),
                                                                                   (1, "0.0005", "FAILED")]
    assert second[0]["objective"] == first[0]["objective"] == read_results(sweep_dir / "0")["objective"]
    assert "objective" not in second[1] and "holds a finished run" in second[1]["error"]
    assert read_results(sweep_dir / "1")["objective"] == first[1]["objective"]  # the first's run, untouched
    with open(sweep_dir / sweep.RESULTS_CSV) as stream:
        assert [(line["job"], line["optimizer.lr"]) for line in csv.DictReader(stream)] == [("0", "0.001"),
                                                                                            ("1", "0.0005")]
    output = (sweep_dir / "output-1.txt").read_text()
    table = output[output.index("Sweep results"):output.index("1 of the sweep's jobs failed")]  # the lines of jobs
    assert "0.003" not in table and re.search(r"\n1 +FAILED +0\.0005 ", table), table


def test_a_failed_jobs_error_of_several_lines_is_one_line_of_the_printed_table(tmp_path: Path) -> None:
    """Job 0's error (its folder holds another run: a line naming the folder, then the setting and what to do) was
    printed as it is, its second line at the table's left edge, where a job's number stands."""
    for lr, status in (("1e-3", 0), ("5e-4", 1)):
        proc = run_app(["-m", *FAST, f"optimizer.lr={lr}", "seed=1", "output_dir=s${seed}",
                        f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
        assert proc.returncode == status, proc.stdout + proc.stderr
    lines = proc.stdout[proc.stdout.index("Sweep results"):].splitlines()[1:]
    table = lines[:next(i for i, line in enumerate(lines) if line.startswith("["))]  # up to the next log line
    assert [line.split()[:2] for line in table] == [["job", "state"], ["0", "FAILED"]], table
    assert "s1 holds a finished run with other settings: optimizer.lr: 0.001 ->" in table[1], table


def test_a_row_holds_the_results_of_the_job_that_returned_them(caplog: pytest.LogCaptureFixture) -> None:
    """results.json read after the job returned: another run's objective there is not this job's row."""
    mine = {"objective": 0.75, "accuracy": 0.75}
    assert sweep.own_results(mine, 0.75, "out/0") is mine
    assert sweep.own_results({**mine, "objective": float("nan")}, float("nan"), "out/0") is not None
    assert sweep.own_results({"objective": 0.5, "accuracy": 0.5}, 0.75, "out/0") == {"objective": 0.75}
    assert "out/0/results.json holds objective 0.5, not this job's 0.75" in caplog.text
    assert sweep.own_results(None, 0.75, "out/0") == {"objective": 0.75}  # an app that writes no results.json


def test_an_optuna_search_runs_its_trials_and_continues_its_study(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "search"
    args = ["-m", *FAST, "hparams_search=quickstart", f"hydra.sweep.dir={sweep_dir}"]
    first = run_app([*args, "hydra.sweeper.n_trials=2"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    again = run_app([*args, "hydra.sweeper.n_trials=1"], cwd=tmp_path)  # the same search, continued
    assert again.returncode == 0, again.stdout + again.stderr

    rows = sweep.read_rows(sweep_dir)
    with sqlite3.connect(sweep_dir / "optuna.db") as db:
        trials = db.execute("SELECT state FROM trials").fetchall()
        lrs = [value for (value,) in db.execute(
            "SELECT param_value FROM trial_params WHERE param_name = 'optimizer.lr'")]
    assert len(trials) == 3 and all(state == "COMPLETE" for (state,) in trials)
    assert len(rows) == 3 and all(row["state"] == "COMPLETED" for row in rows)
    assert sorted(float(row["optimizer.lr"]) for row in rows) == pytest.approx(sorted(lrs))
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs)
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == max(row["objective"] for row in rows)
    # The best printed is a row of the table printed (the continued command's one job, numbered as its trial),
    # and the study's best is said apart where the first command ran it (ties go to the earlier trial).
    said = again.stdout + again.stderr
    assert "best of this command's trials: job 2 of the sweep's table, " in said
    assert ("of an earlier command" in said) == (max(row["objective"] for row in rows[:2]) >= rows[2]["objective"])
    for row in rows:  # each trial in a folder of its own, named by its number in the study
        assert read_results(Path(row["output_dir"]))["objective"] == row["objective"]
        assert Path(row["output_dir"]).name == f"trial={row['job']}"
    assert [row["job"] for row in rows] == [0, 1, 2]


def test_the_studys_best_from_an_earlier_command_is_named_by_its_row_of_the_table_printed(tmp_path: Path) -> None:
    """A grid of two learning rates, one trial a command: the first command's (0.001) completes, the second's (-1)
    is refused, so the study's best is the first command's. The second command said its row was in
    sweep_results.jsonl, as if the table it printed next (the study's trials, every command's) left it out."""
    args = ["-m", *FAST, "hparams_search=quickstart", "hydra/sweeper/sampler=grid",
            "~hydra.sweeper.sampler.n_startup_trials", "hydra.sweeper.sampler.seed=0", "hydra.sweeper.n_trials=1",
            "optimizer.lr=choice(-1,0.001)", "train.batch_size=32", "schedule.warmup_ratio=0.1",
            "optimizer.weight_decay=0.0",
            f"hydra.sweep.dir={tmp_path / 'search'}"]
    first = run_app(args, cwd=tmp_path)
    assert first.returncode == 0 and "trial 0 is job 0: optimizer.lr=0.001 " in first.stdout, first.stdout  # seed 0's
    again = run_app(args, cwd=tmp_path)
    assert again.returncode == 1 and "trial 1 failed: not launched" in again.stdout, again.stdout + again.stderr
    (said,) = [line for line in again.stdout.splitlines() if "the study's best" in line]
    assert "the study's best (of 1 completed trials): trial 0 of an earlier command, job 0 of the sweep's table, " \
           "{'optimizer.lr': 0.001}" in said and "sweep_results.jsonl" not in said, said
    lines = again.stdout[again.stdout.index("Sweep results"):].splitlines()[2:]
    assert [line.split()[:3] for line in lines[:2]] == [["0", "COMPLETED", "0.001"], ["1", "FAILED", "-1"]], lines


def test_trials_that_share_their_named_values_each_run_in_a_folder_and_a_row_of_their_own(tmp_path: Path) -> None:
    """A trial's folder was named by four keys and the seed: trials apart only in another searched key shared a
    folder, the second failing on the first's run ("holds a finished run with other settings") and its row
    replacing the first's. The same grid command again drew tried points again (duplicate trials)."""
    sweep_dir = tmp_path / "search"
    args = ["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={sweep_dir}",
            "optimizer.lr=1e-3", "train.batch_size=32", "schedule.warmup_ratio=0.1", "optimizer.weight_decay=0.01",
            "train.max_steps=choice(4,8)", "hydra/sweeper/sampler=grid", "~hydra.sweeper.sampler.n_startup_trials"]
    for _ in range(2):  # the second: every point tried, nothing to run
        done = run_app(args, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    rows = sweep.read_rows(sweep_dir)
    assert [(row["job"], row["state"]) for row in rows] == [(0, "COMPLETED"), (1, "COMPLETED")], rows
    assert sorted(str(row["train.max_steps"]) for row in rows) == ["4", "8"]
    for row in rows:  # each folder holds its own trial's run
        overrides = read_results(Path(row["output_dir"]))["provenance"]["overrides"]
        assert overrides.count(f"train.max_steps={row['train.max_steps']}") == 1, overrides
    assert "2 untried" not in done.stdout + done.stderr and "0 untried in study quickstart" in done.stdout
    with sqlite3.connect(sweep_dir / "optuna.db") as db:
        assert db.execute("SELECT COUNT(*) FROM trials").fetchone() == (2,)
    # The command that ran none named the study's best by its job in the sweep's table, and printed no table: the
    # table is the study's trials, every command's.
    lines = done.stdout[done.stdout.index("Sweep results"):].splitlines()[1:4]
    assert [line.split()[:2] for line in lines] == [["job", "state"], ["0", "COMPLETED"], ["1", "COMPLETED"]], lines


def test_trials_the_sampler_gives_the_same_values_each_have_a_row(tmp_path: Path) -> None:
    """The random sampler drew a choice() value twice: the second trial answered from the first's folder and
    replaced its row (4 trials, 2 rows)."""
    sweep_dir = tmp_path / "search"
    done = run_app(["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=2", "optimizer.lr=1e-3",
                    "train.batch_size=32", "schedule.warmup_ratio=0.1", "optimizer.weight_decay=0.01",
                    "train.max_steps=choice(4)", "hydra/sweeper/sampler=random",
                    "~hydra.sweeper.sampler.n_startup_trials", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = sweep.read_rows(sweep_dir)
    assert [(row["job"], row["state"]) for row in rows] == [(0, "COMPLETED"), (1, "COMPLETED")], rows
    assert len({row["output_dir"] for row in rows}) == 2


def test_a_grid_search_runs_every_point_of_its_grid_and_ends_with_its_best(tmp_path: Path) -> None:
    """Optuna's grid sampler asks its study to stop once the last point is told, which Optuna refuses outside its
    own optimize loop (its documented ask-and-tell caveat): every grid search ended in a traceback, status 1 and
    no optimization_results.yaml, its trials run."""
    sweep_dir = tmp_path / "grid"
    done = run_app(["-m", *FAST, "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=5",
                    "hydra.sweeper.direction=maximize", "optimizer.lr=choice(0.001,0.002)",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    rows = sweep.read_rows(sweep_dir)  # n_trials=5 of a grid of two points: each point once
    assert sorted(float(row["optimizer.lr"]) for row in rows) == [0.001, 0.002]
    assert all(row["state"] == "COMPLETED" for row in rows)
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == max(row["objective"] for row in rows)


def test_a_search_that_names_no_direction_seeks_the_highest_objective(tmp_path: Path) -> None:
    """Every objective of the project (accuracy, F1, MCC, r) is higher-is-better; the sweeper's default was
    minimize, so `hydra/sweeper=optuna` with a typed space named the worse trial its best, silently."""
    sweep_dir = tmp_path / "search"
    done = run_app(["-m", *FAST, "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=2",
                    "optimizer.lr=choice(1e-5,3e-3)", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    objectives = [row["objective"] for row in sweep.read_rows(sweep_dir)]
    assert len(set(objectives)) == 2, objectives  # the two learning rates end apart: the pick means something
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == max(objectives)


def test_a_trial_its_rules_refuse_fails_without_a_launch_and_the_search_goes_on(tmp_path: Path) -> None:
    """A search draws its trials as it goes, past the command line's check: a trial drawn with a value the schema's
    rules refuse was launched only to fail as it started (under Slurm, after its wait in the queue; on Vertex AI,
    on a machine started for it). The sweeper checks each trial's config first."""
    sweep_dir = tmp_path / "search"
    done = run_app(["-m", *FAST, "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=2",
                    "hydra.sweeper.direction=maximize", "hydra.sweeper.max_failure_rate=1.0",
                    "optimizer.lr=choice(-1,0.001)", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    said = done.stdout + done.stderr
    rows = {row["optimizer.lr"]: row for row in sweep.read_rows(sweep_dir)}
    assert rows["0.001"]["state"] == "COMPLETED" and rows["-1"]["state"] == "FAILED", said
    assert rows["-1"]["error"] == ("not launched: the trial would stop as it starts: optimizer.lr=-1.0 must be "
                                   "positive (e.g. optimizer.lr=2e-5)")
    assert not Path(rows["-1"]["output_dir"]).exists()  # never launched: Hydra made no folder for it
    assert said.count("Launching 1 jobs locally") == 1 and "failed: not launched" in said
    assert done.returncode == 1 and "Traceback" not in said  # a sweep with a failed job ends non-zero


def test_a_trial_drawn_with_data_that_is_not_there_fails_without_a_launch(tmp_path: Path) -> None:
    """A search that draws where its data is (data.dir, the task) is past the command line's look for it: a trial
    drawn with a folder that is not there was launched, and stopped as its data loaded. The sweeper looks first."""
    sweep_dir, nope = tmp_path / "search", tmp_path / "nope"
    done = run_app(["-m", "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=2",
                    "hydra.sweeper.max_failure_rate=1.0", f"data.dir=choice({GLUE_DATA},{nope})", "task=rte",
                    "model=tiny", "train.max_steps=2", "train.batch_size=8", "train.progress_bar=false", "hw=cpu",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    said = done.stdout + done.stderr
    rows = {row["data.dir"]: row for row in sweep.read_rows(sweep_dir)}
    assert rows[str(GLUE_DATA)]["state"] == "COMPLETED" and rows[str(nope)]["state"] == "FAILED", said
    assert rows[str(nope)]["error"].startswith(f"not launched: the trial would stop as it starts: data.dir={nope}: "
                                               f"{nope / 'RTE'} does not exist. A GLUE directory holds")
    assert not Path(rows[str(nope)]["output_dir"]).exists() and said.count("Launching 1 jobs locally") == 1


def test_a_search_stops_only_once_more_than_its_failure_rate_of_its_trials_failed(tmp_path: Path) -> None:
    """hydra.sweeper.max_failure_rate is the share of the command's trials that may fail: one failure in four is
    within 0.3. The share was taken of the trials told so far, so a failure among the first three stopped it
    (1 of 1, 2 or 3: the grid's seeded order puts the refused value third)."""
    sweep_dir = tmp_path / "search"
    done = run_app(["-m", *FAST, "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.sampler.seed=1",
                    "hydra.sweeper.n_trials=4", "hydra.sweeper.direction=maximize",
                    "hydra.sweeper.max_failure_rate=0.3", "optimizer.lr=choice(-1,0.001,0.002,0.003)",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    rows = sweep.read_rows(sweep_dir)
    assert [row["state"] for row in rows].count("COMPLETED") == 3, done.stdout + done.stderr
    assert [row["optimizer.lr"] for row in rows if row["state"] == "FAILED"] == ["-1"]
    assert (sweep_dir / "optimization_results.yaml").exists()  # the search ended as a search, with its best


def test_a_search_stopped_by_its_failure_rate_ends_with_its_first_failure_and_keeps_its_best(tmp_path: Path) -> None:
    """Past max_failure_rate the search raised the failure that crossed it, the second, where the docs promise the
    first's; and it wrote no optimization_results.yaml, though a trial had completed."""
    sweep_dir = tmp_path / "search"
    done = run_app(["-m", *FAST, "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.sampler.seed=1",
                    "hydra.sweeper.n_trials=4", "hydra.sweeper.max_failure_rate=0.3",
                    "optimizer.lr=choice(-1,-2,0.001,0.002)", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    said = done.stdout + done.stderr
    rows = sweep.read_rows(sweep_dir)
    failed = [row["optimizer.lr"] for row in rows if row["state"] == "FAILED"]
    completed = [row for row in rows if row["state"] == "COMPLETED"]
    assert done.returncode == 1 and "Traceback" not in said and sorted(failed) == ["-1", "-2"], said
    assert completed and rows.index(completed[0]) < 3, rows  # a trial completed before the second failure
    first, second = failed  # in the order they failed (the seeded grid's: -1, then -2)
    assert done.stderr.splitlines()[0] == (f"not launched: the trial would stop as it starts: optimizer.lr={first}.0 "
                                           "must be positive (e.g. optimizer.lr=2e-5)"), said
    assert f"optimizer.lr={second}.0" not in done.stderr
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_value"] == max(row["objective"] for row in completed)




def test_a_failed_job_of_a_list_sweep_is_said_once_and_the_batches_after_it_run(tmp_path: Path) -> None:
    """Hydra's basic sweeper raised a job's error once its batch had run: printed under 'Error executing job with
    overrides' and its HYDRA_FULL_ERROR advice beside the closing list's line, and the batches after it
    (hydra.sweeper.max_batch_size) never ran. The table says it, the other jobs run, and the sweep ends with 1."""
    blocker(tmp_path)
    sweep_dir = tmp_path / "sweep"
    proc = run_app(["-m", *FAST, "hydra.sweeper.max_batch_size=1", f"train.checkpoint_dir={BLOCKED},null",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said
    assert [row["state"] for row in rows_by_job(sweep_dir).values()] == ["FAILED", "COMPLETED"]
    assert "Error executing job" not in said and "HYDRA_FULL_ERROR" not in said and "Traceback" not in said
    assert said.count(blocked_error(tmp_path)) == 1, said  # the closing list's line (and the job's train.log)


def test_a_crashed_job_of_a_list_sweep_shows_its_traceback_once_and_the_batches_after_it_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A defect's exception in one job (not a user's error) was raised by Hydra's basic sweeper once the job's batch
    had run: under hydra.sweeper.max_batch_size the batches after it never ran, though the docs say the other jobs
    still run. Its traceback is printed once as the job ends, the other jobs run, and the sweep ends with 1."""
    from nli import recipe

    trains = recipe.run

    def crash_seed_1(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        if cfg.seed == 1:
            raise RuntimeError("a defect in the training code")
        return trains(cfg, *args, **kwargs)

    monkeypatch.setattr(recipe, "run", crash_seed_1)
    sweep_dir = tmp_path / "sweep"
    proc = run_app(["-m", *FAST, "hydra.sweeper.max_batch_size=1", "seed=1,2", f"hydra.sweep.dir={sweep_dir}"],
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [row["state"] for row in rows_by_job(sweep_dir).values()] == ["FAILED", "COMPLETED"]
    assert proc.stderr.count("Traceback (most recent call last):") == 1, proc.stderr
    crashed = proc.stderr[re.search(r"job #0 experiment=quickstart .*seed=1 crashed:\nTraceback", proc.stderr).start():]
    assert "RuntimeError: a defect in the training code\n" in crashed and "HYDRA_FULL_ERROR" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: 1 of the sweep's jobs failed: "), proc.stderr
    assert "#0 " in proc.stdout[proc.stdout.index("1 of the sweep's jobs failed (the others ran):"):]


def test_a_sweep_whose_every_job_failed_does_not_say_the_others_ran(tmp_path: Path) -> None:
    """Its closing list said '2 of the sweep's jobs failed (the others ran)', of a sweep of two jobs, and that their
    folders held results.json and model/, of folders that hold a train.log alone."""
    blocker(tmp_path)
    proc = run_app(["-m", *FAST, f"train.checkpoint_dir={BLOCKED}", "seed=1,2",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 of the sweep's jobs failed:\n  #0 " in proc.stdout and "the others ran" not in proc.stdout, proc.stdout
    assert (f"  jobs     {tmp_path / 'sweep' / '0'} (train.log), and each job's in the table's output_dir column\n"
            in proc.stdout), proc.stdout


def test_a_search_ended_by_a_failed_trial_says_its_error_in_one_line_without_hydras_hint(tmp_path: Path) -> None:
    """Past max_failure_rate the first failure's error ended the search raised through Hydra, which printed it
    under 'Error executing job with overrides: [...]' and ended with its 'Set the environment variable
    HYDRA_FULL_ERROR=1' advice: a stack trace of nothing, for an error the user can fix from its one line."""
    blocker(tmp_path)
    sweep_dir = tmp_path / "search"
    done = run_app(["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=2",
                    "hydra.sweeper.max_failure_rate=0", f"train.checkpoint_dir={BLOCKED}",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said, said
    assert "HYDRA_FULL_ERROR" not in said and "Error executing job" not in said, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {blocked_error(tmp_path)}"), done.stderr
    [row] = sweep.read_rows(sweep_dir)  # the table, printed all the same
    assert row["state"] == "FAILED" and "Sweep results" in done.stdout



def test_the_sweeps_files_name_a_folder_a_job_made_not_a_refused_trials(tmp_path: Path) -> None:
    """The closing list named the first row's folder, that of a trial the search refused (never launched: its
    folder was never made), as where the jobs' results.json, model/ and train.log are."""
    sweep_dir = tmp_path / "search"
    done = run_app(["-m", *FAST, "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.sampler.seed=1",
                    "hydra.sweeper.n_trials=2", "hydra.sweeper.max_failure_rate=0.5", "optimizer.lr=choice(-1,0.001)",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    refused, ran = rows_by_job(sweep_dir).values()
    assert refused["error"].startswith("not launched") and not Path(refused["output_dir"]).exists()
    assert ran["state"] == "COMPLETED"
    assert (f"  jobs     {ran['output_dir']} (results.json, model/, eval_predictions/, train.log), and each job's "
            "in the table's output_dir column\n") in done.stdout


def test_a_trial_that_ends_with_an_undefined_objective_ends_the_search_in_one_line(tmp_path: Path) -> None:
    """A run can train to its end with an objective the study cannot rank (NaN: STS-B's Pearson's r where the gold
    scores or the predictions are all equal). The study counts it failed; with no failure allowed, the search ended
    with a traceback (a RuntimeError: "returned nan, not a number"). Now one line says why, and its row is COMPLETED
    (the job trained to its end), with its NaN objective."""
    sweep_dir, glue = tmp_path / "search", stsb_with_one_gold_score(tmp_path / "glue")
    done = run_app(["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "optimizer.lr=interval(1e-4,1e-3)",
                    "task=stsb", f"data.dir={glue}", "model=tiny", "train.max_steps=2", "train.batch_size=8",
                    "train.progress_bar=false", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said, said
    assert ("error: trial 0 (job 0) ended with objective nan, which the study cannot rank (its metric is undefined on "
            "its eval set: Pearson's or Spearman's r where the gold scores or the predictions are all equal), and "
            "counts as failed: more trials failed than hydra.sweeper.max_failure_rate=0.0 allows") in done.stderr
    [row] = sweep.read_rows(sweep_dir)
    assert row["state"] == "COMPLETED" and math.isnan(row["objective"]), row


@pytest.mark.parametrize("typed, said", [
    ("hydra.sweeper.direction=maximise", "error: hydra.sweeper.direction=maximise: minimize or maximize"),
    ("hydra.sweeper.n_trail=3", "error: hydra.sweeper.n_trail is not a key of this config: did you mean "
                                "hydra.sweeper.n_trials? hydra.sweeper takes sampler, pruner, direction, study_name, "),
    ("hydra.sweeper.sampler.seeds=3", "error: hydra.sweeper.sampler.seeds is not a key of this config: did you mean "
                                      "hydra.sweeper.sampler.seed? hydra.sweeper.sampler takes seed, "),
    ("+hydra.sweeper.n_trail=3", "error: hydra.sweeper.n_trail is not a setting of the Optuna sweeper: it takes "
                                 "direction, study_name, storage, n_trials, "),
    ("hydra.sweeper.n_trials=x", "error: hydra.sweeper.n_trials=x: Value 'x' of type 'str' could not be converted "
                                 "to Integer"),
])
def test_a_bad_sweeper_key_or_value_ends_the_search_in_one_line_before_any_trial(tmp_path: Path, typed: str,
                                                                                   said: str) -> None:
    sweep_dir = tmp_path / "search"
    proc = run_app(["-m", *FAST, "hparams_search=quickstart", typed, f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(said), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (sweep_dir / "optuna.db").exists()
    assert not [path for path in sweep_dir.glob("*") if path.is_dir()]  # no trial's folder


def refused_search(sweep_dir: Path, *typed: str) -> str:
    """The one line a search of one trial is refused with, where it starts no trial."""
    proc = run_app(["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=1", *typed,
                    f"hydra.sweep.dir={sweep_dir}"], cwd=sweep_dir.parent)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert not [path for path in sweep_dir.glob("*") if path.is_dir()]  # no trial's folder
    return proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("name, storage, why", [
    ("optuna.db", "sqlite:///{}", " cannot be read as an Optuna study ((sqlite3.DatabaseError) file is not a "
     "database): move that file aside to start a new study there (the trials' folders stay), or give "
     "hydra.sweeper.storage another one"),
    # Optuna's reader passed the line (a last line, a write in progress) and wrote after it; then it failed.
    ("study.journal", "journal:{}", ": line 1 of {} is not a whole entry of Optuna's journal: remove it where a write "
     "was cut short there, or move the file aside to start a new study"),
], ids=["sqlite", "journal"])
def test_a_study_file_optuna_cannot_read_is_refused_in_one_line_and_kept(tmp_path: Path, name: str, storage: str,
                                                                         why: str) -> None:
    """A damaged study file (a copy cut short, another program's file) ended the search with a traceback."""
    sweep_dir = tmp_path / "search"
    sweep_dir.mkdir()
    (sweep_dir / name).write_bytes(b"not a study\n")
    storage = storage.format(sweep_dir / name)
    said = refused_search(sweep_dir, f"hydra.sweeper.storage={storage}")
    assert said == f"error: hydra.sweeper.storage={storage}{why.format(sweep_dir / name)}"
    assert (sweep_dir / name).read_bytes() == b"not a study\n"


@pytest.mark.parametrize("storage, why", [
    ("sqlite:////nonexistent/dir/optuna.db", ": the folder /nonexistent/dir does not exist: make it, or give the study "
     "a file in a folder that does"),
    ("sqlite:/bad", " is not a database URL SQLAlchemy reads (Could not parse SQLAlchemy URL from given URL string): "
     "give sqlite:///<path>/optuna.db (three slashes before a relative path, four before an absolute one) or "
     "journal:<file>"),
    ("'postgresql://me@localhost/studies'", ": the database driver psycopg2 is not installed: pip install "
     "psycopg2-binary, or keep the study in a file (sqlite:///<path>/optuna.db)"),
], ids=["missing-folder", "bad-url", "missing-driver"])
def test_a_storage_that_cannot_be_opened_is_refused_by_what_is_wrong_in_one_line(tmp_path: Path, storage: str,
                                                                                 why: str) -> None:
    """Each was told to move a file aside (the missing folder, the bad URL: "cannot be read as an Optuna study"),
    or ended in an ImportError's traceback (a server's database without its driver)."""
    sweep_dir = tmp_path / "search"
    said = refused_search(sweep_dir, f"hydra.sweeper.storage={storage}")
    assert said == f"error: hydra.sweeper.storage={storage.strip(chr(39))}{why}"


def hold_lock(db: Path) -> sqlite3.Connection:
    """A connection that holds ``db`` locked, as a second process's write would, until it is closed."""
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def test_a_study_another_process_holds_locked_is_waited_for_then_refused_as_locked_and_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A healthy study locked by another process was refused as a file that "cannot be read as an Optuna study",
    with the advice to move it aside: followed, it threw the study away."""
    monkeypatch.setattr("nli.sweep.search.LOCK_TRIES", 1, raising=False)  # SQLite itself waits 5 s a try
    sweep_dir = tmp_path / "search"
    sweep_dir.mkdir()
    optuna.create_study(study_name="quickstart", storage=f"sqlite:///{sweep_dir}/optuna.db", direction="maximize")
    holder = hold_lock(sweep_dir / "optuna.db")
    try:
        said = refused_search(sweep_dir)
    finally:
        holder.close()
    assert said == (f"error: hydra.sweeper.storage=sqlite:///{sweep_dir}/optuna.db: another process holds the study's "
                    "database locked (a second command on the study, or a program reading optuna.db), and opening the "
                    "study failed after 1 tries: wait for that process to end, then run the same command again")
    assert optuna.load_study(study_name="quickstart", storage=f"sqlite:///{sweep_dir}/optuna.db").trials == []


def test_a_study_locked_as_a_trial_ends_is_one_line_and_the_next_command_keeps_the_trials_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock taken while a trial ran ended the search in a 50-line StorageInternalError traceback, the finished
    trial left RUNNING unsaid. Now one line; the same command again takes the trial up first, from its run."""
    from nli.sweep.slots import Slots

    monkeypatch.setattr("nli.sweep.search.LOCK_TRIES", 2, raising=False)
    sweep_dir, holders = tmp_path / "search", []
    ended = Slots.wait

    def locked_as_it_ends(slots: Slots) -> Any:
        done = ended(slots)
        holders.append(hold_lock(sweep_dir / "optuna.db"))
        return done

    monkeypatch.setattr(Slots, "wait", locked_as_it_ends)
    args = ["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={sweep_dir}"]
    proc = run_app(args, cwd=tmp_path)
    for holder in holders:
        holder.close()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: hydra.sweeper.storage=sqlite:///{sweep_dir}/optuna.db: another process holds the study's database "
        "locked (a second command on the study, or a program reading optuna.db), and storing how trial 0 ended "
        f"({sweep.read_rows(sweep_dir)[0]['objective']}) failed after 2 tries: wait for that process to end, then "
        "run the same command again"]
    monkeypatch.setattr(Slots, "wait", ended)
    again = run_app(args, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "trial 0 was stopped before it ended" in again.stdout
    # Both commands' rows are of job 0, one trial of the study: the report and the table hold it once, the newest row.
    first, taken_up = sweep.read_rows(sweep_dir)
    assert (first["job"], first["study"]) == (taken_up["job"], taken_up["study"]) == (0, first["study"])
    assert sweep.of_study([first, taken_up], taken_up["sweep"]) == [taken_up]
    assert [(row["sweep"], row["ended"]) for row in report.load_rows([sweep_dir])] == [(taken_up["sweep"],
                                                                                        taken_up["ended"])]
    objective = sweep.read_rows(sweep_dir)[0]["objective"]
    with sqlite3.connect(sweep_dir / "optuna.db") as db:  # n_trials=1: the trial taken up, its run's objective
        assert db.execute("SELECT t.state, v.value FROM trials t LEFT JOIN trial_values v USING (trial_id) "
                          "ORDER BY t.number").fetchall() == [("FAIL", None), ("COMPLETE", objective)]


@pytest.mark.parametrize("checkpoint, study", [("model=roberta-base", "rte-roberta-base"),
                                               ("model.name_or_path={tmp}/data/runs/rte/model/", "rte-model")])
def test_the_glue_search_names_its_study_and_folder_by_the_checkpoints_last_path_part(tmp_path: Path,
                                                                                       checkpoint: str,
                                                                                       study: str) -> None:
    """The study was named by the whole Hub id or path, `rte-FacebookAI/roberta-base` (docs: `rte-roberta-base`),
    and so its folder, nested: multirun/search/rte-FacebookAI/roberta-base, search/rte-/data/runs/rte/model/. The
    study is found where the docs put it (refused there for its direction: no trial runs, none would load a model).
    The checkpoint's folder is there, empty: a local path that is not is refused first (nli.config.paths)."""
    checkpoint = checkpoint.format(tmp=tmp_path)
    if "name_or_path" in checkpoint:
        Path(checkpoint.partition("=")[2]).mkdir(parents=True)
    search = tmp_path / "multirun" / "search"
    (search / study).mkdir(parents=True)
    optuna.create_study(study_name=study, storage=f"sqlite:///{search / study}/optuna.db", direction="minimize")
    proc = run_app(["-m", "hparams_search=glue", "task=rte", "model=roberta-base", checkpoint,
                    "hydra.sweeper.n_trials=1"], cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    said = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and said, proc.stdout + proc.stderr
    assert said[-1].startswith(f"error: hydra.sweeper.direction=maximize: the study {study} in hydra.sweeper.storage="
                               f"sqlite:///multirun/search/{study}/optuna.db was started to minimize"), proc.stderr
    assert [path.name for path in search.iterdir()] == [study]


def study_of_one_trial(sweep_dir: Path) -> Path:
    """``sweep_dir`` with a quickstart study of one finished trial, whose folder is removed: refused_search asserts
    that a refused search makes none."""
    first = run_app(["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=1",
                     f"hydra.sweep.dir={sweep_dir}"], cwd=sweep_dir.parent)
    assert first.returncode == 0, first.stdout + first.stderr
    for path in sweep_dir.glob("*"):
        if path.is_dir():
            shutil.rmtree(path)
    return sweep_dir


def test_a_study_continued_in_the_other_direction_or_by_another_optuna_is_refused_by_name(tmp_path: Path) -> None:
    """Optuna continues a stored study in its stored direction whatever hydra.sweeper.direction says: the sampler
    sought the opposite of what the search reported as best. Tables of another Optuna version: its message, in a
    line, where it was a traceback."""
    sweep_dir = study_of_one_trial(tmp_path / "search")
    said = refused_search(sweep_dir, "hydra.sweeper.direction=minimize")
    assert said == (f"error: hydra.sweeper.direction=minimize: the study quickstart in hydra.sweeper.storage=sqlite:///"
                    f"{sweep_dir}/optuna.db was started to maximize (1 trial): continue it with "
                    "hydra.sweeper.direction=maximize, or start another (hydra.sweeper.study_name)")
    with sqlite3.connect(sweep_dir / "optuna.db") as db:
        assert db.execute("SELECT COUNT(*) FROM trials").fetchone() == (1,)  # untouched
        db.execute("UPDATE alembic_version SET version_num = 'v9.0.0.a'")  # tables of an Optuna to come
    said = refused_search(sweep_dir)
    assert said.startswith(f"error: hydra.sweeper.storage=sqlite:///{sweep_dir}/optuna.db: The runtime optuna "
                           f"version {optuna.__version__} is no longer compatible with the table schema"), said


def test_a_study_continued_with_other_settings_is_refused_by_key(tmp_path: Path) -> None:
    """A study continued with settings its trials did not share: the glue search from two runs' model/ folders (both
    study rte-model) continued the first's study, its sampler learning from the other model's trials and its best
    trial possibly one of them. Settings that change nothing computed (hw, logger) may differ."""
    sweep_dir = study_of_one_trial(tmp_path / "search")
    said = refused_search(sweep_dir, "train.max_steps=7", "+model.dropout=0.2", "hw=cpu", "logger=csv")
    assert said == (f"error: the study quickstart in hydra.sweeper.storage=sqlite:///{sweep_dir}/optuna.db ran its 1 "
                    "trial with other settings (+model.dropout: (not given) -> 0.2; train.max_steps: 12 -> 7), and its "
                    "sampler and best trial would mix them with this command's: give the same settings to continue "
                    "it, or start another (another hydra.sweeper.study_name or hydra.sweeper.storage)")
    with sqlite3.connect(sweep_dir / "optuna.db") as db:
        assert db.execute("SELECT state FROM trials").fetchall() == [("COMPLETE",)]  # no trial asked
    continued = run_app(["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=1", "hw=cpu", "logger=csv",
                         f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert continued.returncode == 0, continued.stdout + continued.stderr
    with sqlite3.connect(sweep_dir / "optuna.db") as db:
        assert db.execute("SELECT state FROM trials").fetchall() == [("COMPLETE",)] * 2


@pytest.mark.parametrize("typed, said", [
    ("train.batch_size=choice(8,16)", "train.batch_size=choice(8, 16): the study quickstart in {storage} drew "
     "train.batch_size from choice(16, 32, 64) (1 trial), and Optuna cannot continue it with another "
     "(CategoricalDistribution does not support dynamic value space): give "
     "train.batch_size='choice(16, 32, 64)' to continue the study, or start another (another "
     "hydra.sweeper.study_name or hydra.sweeper.storage)"),
    ("schedule.warmup_ratio=tag(log,interval(0.01,0.2))", "schedule.warmup_ratio=tag(log, interval(0.01, 0.2)): the "
     "study quickstart in {storage} drew schedule.warmup_ratio from interval(0.0, 0.2) (1 trial), and Optuna cannot "
     "continue it with another (Cannot set different log configuration to the same parameter name): give "
     "schedule.warmup_ratio='interval(0.0, 0.2)' to continue the study, or start another"),
], ids=["choice", "log"])
def test_a_study_continued_with_a_space_optuna_cannot_take_is_refused_by_key_before_any_trial(
        tmp_path: Path, typed: str, said: str) -> None:
    """Optuna takes a continued study's key only from a distribution like the stored one: another choice() ended
    the search in a traceback at the first ask, and left that trial RUNNING, which the next command "resumed"."""
    sweep_dir = study_of_one_trial(tmp_path / "search")
    refused = refused_search(sweep_dir, typed)
    assert refused.startswith("error: " + said.format(storage=f"hydra.sweeper.storage=sqlite:///{sweep_dir}/optuna.db"))
    with sqlite3.connect(sweep_dir / "optuna.db") as db:
        assert db.execute("SELECT state FROM trials").fetchall() == [("COMPLETE",)]  # no trial asked


def test_a_search_with_nothing_to_search_is_refused_before_any_trial(tmp_path: Path) -> None:
    """hydra/sweeper=optuna without a range ran n_trials trials of one config, each a run of its own. Refused, it
    leaves no folder of its own: an empty one looked like a sweep's."""
    sweep_dir = tmp_path / "multirun" / "search"
    proc = run_app(["-m", *FAST, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={sweep_dir}"],
                   cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: the search has nothing to search: no key is given values to draw from. Give one a range (python "
        "train.py -m hydra/sweeper=optuna 'optimizer.lr=tag(log,interval(1e-5,1e-3))', docs/sweeps.md), or run once "
        "without -m")
    assert not (tmp_path / "multirun").exists()  # the folders the sweep made for its directory, removed
    (tmp_path / "multirun").mkdir()
    assert run_app(["-m", *FAST, "hydra/sweeper=optuna", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path).returncode == 1
    assert (tmp_path / "multirun").is_dir() and not sweep_dir.exists()  # what was there before stays


def test_a_trial_asked_for_that_never_gets_a_job_is_failed_not_left_running(tmp_path: Path) -> None:
    """An interval() for an int key draws a value the config refuses once the trial is asked for: the search ended
    in Hydra's message of six lines, and the trial was left RUNNING, which the next command took for a stopped trial
    to resume. Now one line, and the trial is FAIL."""
    sweep_dir = tmp_path / "search"
    done = run_app(["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=1",
                    "train.batch_size=interval(8,16)", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stdout + done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"error: trial 0: Error merging override train.batch_size=[\d.]+: Value '[\d.]+' of type "
                        r"'float' could not be converted to Integer: give that key a range of values its type takes "
                        r"\(an integer key: choice\(\) or range\(\)\)", said), done.stderr
    with sqlite3.connect(sweep_dir / "optuna.db") as db:
        assert db.execute("SELECT state FROM trials").fetchall() == [("FAIL",)]


def test_a_misspelt_pruner_is_named_with_the_pruners_there_are(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "search"
    proc = run_app(["-m", *FAST, "hparams_search=quickstart", "hydra/sweeper/pruner=medain",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and not sweep_dir.exists(), proc.stderr
    said = ("error: In 'hydra/sweeper/optuna': Could not find 'hydra/sweeper/pruner/medain'\n\n"
            "Available options in 'hydra/sweeper/pruner':\n\thyperband\n\tmedian\n")
    assert proc.stderr.startswith(said), proc.stderr
    assert "Config search path" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr


def test_a_searchs_range_is_changed_from_the_command_line_by_its_key(tmp_path: Path) -> None:
    """``hydra.sweeper.params.optimizer.lr=...`` cannot be set (Hydra reads the key's dots as nesting): refused with
    the form that works, the key typed with a range (the search's space for it) or one value (out of the search)."""
    sweep_dir = tmp_path / "search"
    args = ["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={sweep_dir}"]
    refused = run_app([*args, "hydra.sweeper.params.optimizer.lr=tag(log,interval(2e-4,3e-4))"], cwd=tmp_path)
    assert refused.returncode == 1 and not sweep_dir.exists()
    assert refused.stderr == ("error: hydra.sweeper.params.optimizer.lr=tag(log,interval(2e-4,3e-4)) cannot be set: "
                              "Hydra reads the dots of optimizer.lr as nesting. Type the key itself: "
                              "'optimizer.lr=tag(log,interval(2e-4,3e-4))'; a range typed for a key is the search's "
                              "space for it, and one value takes it out of the search\n")
    searched = run_app([*args, "optimizer.lr=tag(log,interval(2e-4,3e-4))", "train.batch_size=16"], cwd=tmp_path)
    assert searched.returncode == 0, searched.stdout + searched.stderr
    rows = sweep.read_rows(sweep_dir)
    assert len(rows) == 2 and all(2e-4 <= float(row["optimizer.lr"]) <= 3e-4 for row in rows)
    assert {read_results(Path(row["output_dir"]))["provenance"]["overrides"].count("train.batch_size=16")
            for row in rows} == {1}


# -------------------------------------------------------------------------------- in process


def _row(num: int, folder: str, objective: float | None, *, seed: int = 1, state: str = "COMPLETED") -> Dict[str, Any]:
    results = None if objective is None else {"objective": objective, "accuracy": objective, "train_steps": 10}
    return sweep.job_row(num=num, state=state, overrides=["optimizer.lr=1e-3", f"seed={seed}"], results=results,
                         output_dir=folder, error=None if objective is not None else "error: it broke")


def test_settings_of_other_tasks_or_other_eval_data_are_never_subtracted() -> None:
    """A sweep over task=rte,wnli (and learning rates, over seeds): RTE's accuracy less WNLI's is no difference
    between two settings, so none is computed across tasks or eval data; the learning rates within a task are."""
    def rows(key: str, values: Tuple[str, str]) -> List[Dict[str, Any]]:
        settings = [(value, lr, seed) for value in values for lr in ("1e-3", "3e-3") for seed in (1, 2)]
        return [sweep.job_row(num=num, state="COMPLETED", output_dir=str(num),
                              overrides=[f"{key}={value}", f"optimizer.lr={lr}", f"seed={seed}"],
                              results={"objective": 0.5 + 0.1 * (value == values[1]) + 0.01 * (lr == "3e-3")
                                       + 0.001 * seed})
                for num, (value, lr, seed) in enumerate(settings)]

    assert [(pair.key, dict(pair.fixed)) for pair in sweep.setting_pairs(rows("task", ("rte", "wnli")))] == [
        ("optimizer.lr", {"task": "rte"}), ("optimizer.lr", {"task": "wnli"})]
    for key in ("data.max_eval_samples", "data.files.validation"):
        assert [pair.key for pair in sweep.setting_pairs(rows(key, ("64", "128")))] == ["optimizer.lr"] * 2
    assert sorted(pair.key for pair in sweep.setting_pairs(rows("train.epochs", ("2", "3")))) == [
        "optimizer.lr", "optimizer.lr", "train.epochs", "train.epochs"]  # a training setting is compared


def test_presets_that_resolve_other_tasks_are_never_subtracted() -> None:
    """``-m experiment=roberta-large-mnli,roberta-large-from-mnli seed=1,2``: the row holds the key typed, and
    results.json the task each preset resolved (MNLI, RTE), so the presets are not compared; two presets of
    one task are."""
    def rows(tasks: Dict[str, str | None]) -> List[Dict[str, Any]]:
        return [sweep.job_row(num=num, state="COMPLETED", output_dir=str(num),
                              overrides=[f"experiment={preset}", f"seed={seed}"],
                              results={"objective": 0.5 + 0.1 * num, sweep.TASK: task})
                for num, ((preset, task), seed) in enumerate(product(tasks.items(), (1, 2)))]

    assert sweep.setting_pairs(rows({"roberta-large-mnli": "mnli", "roberta-large-from-mnli": "rte"})) == []
    alike = sweep.setting_pairs(rows({"roberta-large-mnli": "mnli", "electra-large-mnli": "mnli"}))
    assert [(pair.key, pair.a, pair.b) for pair in alike] == [
        ("experiment", "roberta-large-mnli", "electra-large-mnli")]
    # A job's results.json written before it named its task: the pair is kept, as before.
    assert len(sweep.setting_pairs(rows({"roberta-large-mnli": "mnli", "electra-large-mnli": None}))) == 1


def test_a_rerun_job_replaces_its_row_in_place(tmp_path: Path) -> None:
    sweep.record(tmp_path, _row(0, "a", None, state="FAILED"))
    sweep.record(tmp_path, _row(1, "b", 0.5))
    sweep.record(tmp_path, _row(0, "a", 0.75))
    rows = sweep.read_rows(tmp_path)
    assert [(row["job"], row["state"], row.get("objective")) for row in rows] == [(0, "COMPLETED", 0.75),
                                                                                   (1, "COMPLETED", 0.5)]
    lines = (tmp_path / sweep.RESULTS_CSV).read_text().splitlines()
    assert lines[0].startswith("job,state,overrides,optimizer.lr,seed,") and len(lines) == 3
    assert lines[1].split(",")[2] == "optimizer.lr=1e-3 seed=1"


def test_two_jobs_given_one_output_dir_keep_a_row_each(tmp_path: Path) -> None:
    """The second job is refused by the first one's finished run there: its failed row is not the first's, and its
    advice names the sweep's folder (it named hydra.run.dir, which a sweep does not read)."""
    sweep_dir, one_dir = tmp_path / "sweep", tmp_path / "one-run"
    proc = run_app(["-m", *FAST, f"hydra.sweep.dir={sweep_dir}", f"output_dir={one_dir}", "seed=1,2"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = rows_by_job(sweep_dir)
    assert rows[0]["state"] == "COMPLETED" and rows[0]["objective"] == read_results(one_dir)["objective"]
    assert rows[1]["state"] == "FAILED" and "holds a finished run with other settings" in rows[1]["error"]
    # The way out is a sweep's: Hydra reads no hydra.run.dir under -m.
    assert "give this run its own output_dir (or the sweep another hydra.sweep.dir)" in rows[1]["error"]
    with open(sweep_dir / sweep.RESULTS_CSV, newline="") as table:
        assert [line["job"] for line in csv.DictReader(table)] == ["0", "1"]


def test_seeds_that_each_write_to_a_folder_of_their_own_are_one_setting(tmp_path: Path) -> None:
    """output_dir=runs/s${seed}: the folder each job wrote to is no swept setting, or every seed is a setting alone."""
    sweep_dir = tmp_path / "sweep"
    proc = run_app(["-m", *FAST, f"hydra.sweep.dir={sweep_dir}", "output_dir=runs/s${seed}", "seed=1,2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [Path(row["output_dir"]).parts[-2:] for row in rows_by_job(sweep_dir).values()] == [("runs", "s1"),
                                                                                               ("runs", "s2")]
    with open(sweep_dir / sweep.SUMMARY_CSV, newline="") as summary:
        (group,) = csv.DictReader(summary)
    assert group["n"] == "2" and group["seeds"] == "1 2" and "output_dir" not in group
    assert not (sweep_dir / sweep.DIFFERENCES_CSV).exists()  # one setting: nothing to tell apart


def test_a_relative_output_dir_is_recorded_whole_for_a_report_made_elsewhere(tmp_path: Path) -> None:
    """output_dir=runs/s${seed} is relative to where the sweep ran: a report made from elsewhere found no job folder
    (every learning curve skipped, "no metrics.csv")."""
    sweep_dir, here = tmp_path / "sweep", tmp_path / "here"
    here.mkdir()
    proc = run_app(["-m", *FAST, f"hydra.sweep.dir={sweep_dir}", "output_dir=runs/s${seed}", "seed=1,2"], cwd=here)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = rows_by_job(sweep_dir)
    assert [row["output_dir"] for row in rows.values()] == [str(here / "runs" / "s1"), str(here / "runs" / "s2")]
    assert rows[0]["objective"] == read_results(here / "runs" / "s1")["objective"]
    curves, skipped = report.load_curves(report.load_rows([sweep_dir]), ["seed"])  # from the suite's cwd
    assert skipped == [] and len(curves) == 2


def test_the_table_lists_jobs_by_number_whatever_order_they_ended_in(tmp_path: Path) -> None:
    """Jobs side by side (joblib, the local GPUs, Vertex AI) end in any order; the jsonl keeps it, the table not."""
    for num in (2, 0, 1):
        sweep.record(tmp_path, _row(num, str(num), 0.5))
    assert [row["job"] for row in sweep.read_rows(tmp_path)] == [2, 0, 1]
    table = (tmp_path / sweep.RESULTS_CSV).read_text().splitlines()
    assert [line.split(",")[0] for line in table[1:]] == ["0", "1", "2"]


def _write_rows(args: tuple[str, int]) -> None:
    directory, worker = args
    for num in range(10):
        sweep.record(Path(directory), _row(worker * 10 + num, f"{worker}-{num}", 0.5))


def test_jobs_that_end_at_once_lose_no_row(tmp_path: Path) -> None:
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_write_rows, [(str(tmp_path), worker) for worker in range(4)])
    assert sorted(row["job"] for row in sweep.read_rows(tmp_path)) == list(range(40))
    assert len((tmp_path / sweep.RESULTS_CSV).read_text().splitlines()) == 41


def test_seed_groups_are_the_rows_own_mean_and_sd() -> None:
    rows = [_row(0, "a", 0.5, seed=1), _row(1, "b", 0.7, seed=2), _row(2, "c", 0.9, seed=3),
            _row(3, "d", None, seed=4, state="FAILED")]
    (group,) = sweep.seed_groups(rows)
    assert group["optimizer.lr"] == "0.001" and group["n"] == 3 and group["failed"] == 1 and group["seeds"] == "1 2 3"
    assert group["objective_mean"] == pytest.approx(0.7) and group["objective_sd"] == pytest.approx(0.2)
    assert "train_steps_mean" not in group  # a counter, not a metric
    assert sweep.seed_groups([{**row, "overrides": ["optimizer.lr=1e-3"]} for row in rows]) == []  # no seeds swept


@pytest.mark.parametrize("failed_first", [True, False])
def test_the_seeds_table_shows_the_metrics_whichever_group_comes_first(failed_first: bool) -> None:
    """A setting whose every job failed has no means: its row is empty there, and the others' figures stay."""
    rows = [_row(0, "a", 0.5, seed=1), _row(1, "b", 0.7, seed=2)]
    failed = [{**_row(2 + i, f"f{i}", None, seed=1 + i, state="FAILED"), "overrides": ["optimizer.lr=-1", f"seed={i}"],
               "optimizer.lr": "-1"} for i in (1, 2)]
    groups = sweep.seed_groups([*failed, *rows] if failed_first else [*rows, *failed])
    table = sweep.format_groups(groups).splitlines()
    assert table[0].split() == ["optimizer.lr", "n", "failed", "objective"]
    assert {line.split()[0]: line.split()[1:] for line in table[1:]} == {"0.001": ["2", "0", "0.6000", "±", "0.1414"],
                                                                          "-1": ["0", "2"]}


def test_only_this_sweeps_failures_end_it_non_zero(tmp_path: Path) -> None:
    """A failed row from an earlier sweep in the same directory, not rerun, is neither in this sweep's
    table nor fails it."""
    callback = sweep.SweepResults()
    config: Any = _config(tmp_path)
    callback.on_multirun_start(config)
    sweep.record(tmp_path, {**_row(0, "earlier", None, state="FAILED"), **callback.stamp()})
    with pytest.raises(SystemExit):
        callback.on_multirun_end(config)
    callback.on_multirun_start(config)
    sweep.record(tmp_path, {**_row(1, "now", 0.5), **callback.stamp()})
    callback.on_multirun_end(config)  # no SystemExit
    assert [row["output_dir"] for row in sweep.read_rows(tmp_path)] == ["earlier", "now"]
    assert len((tmp_path / sweep.RESULTS_CSV).read_text().splitlines()) == 2  # header and this sweep's row
    assert not (tmp_path / SWEEP_CLAIM).exists()


def test_a_table_that_cannot_be_made_ends_the_sweep_non_zero_through_hydras_callbacks(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Hydra turns an exception in a callback into a warning: a sweep whose table could not be written (here its
    summary's path is taken by a folder) ended with status 0 and no table. Now it says so and ends with 1, and its
    directory is let go."""
    from hydra._internal.callbacks import Callbacks

    callback = sweep.SweepResults()
    callbacks = Callbacks()
    callbacks.callbacks.append(callback)  # as Hydra holds the callbacks of hydra.callbacks
    config: Any = _config(tmp_path)
    callbacks.on_multirun_start(config)
    for num, seed in ((0, 1), (1, 2)):  # seeds: a summary to write
        sweep.record(tmp_path, {**_row(num, str(num), 0.5 + num / 10, seed=seed), **callback.stamp()})
    (tmp_path / sweep.SUMMARY_CSV).mkdir()
    with pytest.raises(SystemExit) as ended, caplog.at_level(logging.ERROR, logger="nli.sweep.table"):
        callbacks.on_multirun_end(config)
    assert ended.value.code == 1
    assert "the sweep's table could not be made (IsADirectoryError: [Errno 21] Is a directory: " in caplog.text
    assert f"its rows are in {tmp_path / sweep.RESULTS_JSONL}, and python -m nli.report {tmp_path}" in caplog.text
    assert not (tmp_path / SWEEP_CLAIM).exists()


def test_a_jobs_row_that_cannot_be_written_is_said_with_the_row_and_the_sweep_ends_non_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk is full for a moment as the first job's row is written. Hydra turned the callback's error into a
    warning: the job ran, the table lacked it, and the sweep ended 0. Now the log gives the row to add back, the
    table has the other job, and the sweep ends with 1 naming the job."""
    sweep_dir, replace, calls = tmp_path / "sweep", sweep.replace, []

    def full_once(path: Path, text: str) -> None:
        calls.append(path.name)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        replace(path, text)

    monkeypatch.setattr(sweep, "replace", full_once)
    proc = run_app(["-m", *FAST, "optimizer.lr=1e-3,3e-3", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert calls[0] == sweep.RESULTS_JSONL
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = re.search(r"job #0's row could not be added to (.*) \(OSError: \[Errno 28\] No space left on device\), so "
                     r"the sweep's table will lack it; add this line to that file, then python -m nli.report (.*) "
                     r"makes the report with it:\n(.*)\n", proc.stdout)
    assert said and said.groups()[:2] == (str(sweep_dir / sweep.RESULTS_JSONL), str(sweep_dir)), proc.stdout
    row = json.loads(said.group(3))
    assert row["job"] == 0 and row["objective"] == read_results(sweep_dir / "0")["objective"]
    assert list(rows_by_job(sweep_dir)) == [1]
    assert "1 job(s) ran but their rows could not be recorded, so the table lacks them (each row is in the log " \
           "above): #0" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr and not (sweep_dir / SWEEP_CLAIM).exists()


def _config(sweep_dir: Path) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}})


def test_columns_of_every_row_are_in_the_csv(tmp_path: Path) -> None:
    rows: List[Dict[str, Any]] = [_row(0, "a", 0.5), {**_row(1, "b", 0.6), "vertex_job": "projects/p/jobs/1"}]
    for row in rows:
        sweep.record(tmp_path, row)
    header = (tmp_path / sweep.RESULTS_CSV).read_text().splitlines()[0].split(",")
    assert header[-1] == "vertex_job" and "objective" in header and "error" in header


def test_override_columns_write_values_as_hydra_writes_a_sweeps_jobs() -> None:
    """A run folder's overrides are kept as typed and a sweep job's as Hydra writes them back: read alike, they are
    one setting. A sweep of values in a hand-edited overrides.yaml has no single value: it stays as typed, where
    Hydra raised "Cannot convert sweep to str" and the report ended in its traceback."""
    typed = sweep.override_columns(["optimizer.lr=1e-3", "train.progress_bar=false", "model=tiny", "seed=1,2"])
    assert typed == {"optimizer.lr": "0.001", "train.progress_bar": "False", "model": "tiny", "seed": "1,2"}
    assert sweep.override_columns(["optimizer.lr=0.001", "train.progress_bar=False"]) == {
        "optimizer.lr": "0.001", "train.progress_bar": "False"}
