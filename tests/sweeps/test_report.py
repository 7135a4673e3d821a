"""`python -m nli.report` (nli/sweep/report.py) on a real sweep: one `train.py -m` over two learning rates
and two seeds, shared by the module, and the report read back as a reader would read it: its
tables parsed from the Markdown, its PNGs decoded."""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

import matplotlib.figure
import matplotlib.image
import matplotlib.legend
import pytest
import yaml

from nli.contract import CLAIM_FILE, PREEMPTED
from nli.sweep import calibration_plot, plots, report
from nli.sweep import table as sweep
from nli.train.checkpoint import Progress
from nli.train.hooks import Revisit
from tests.support.runs import FAST, ROOT, copy_run, read_results, run_app, shared_folder
from tests.sweeps.test_sweep import rerun_sweep

LRS = ("0.001", "0.003")  # as Hydra's sweeper writes 1e-3,3e-3 back
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
OBJECTIVE_PNG = "objective_vs_optimizer.lr.png"
RELIABILITY = calibration_plot.RELIABILITY


SWEEP = ["-m", *FAST, "optimizer.lr=1e-3,3e-3", "seed=1,2"]


def run_sweep(directory: Path) -> None:
    proc = run_app([*SWEEP, f"hydra.sweep.dir={directory}"], cwd=directory.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def shared_sweep(shared_root: Path) -> Path:
    """Four real jobs, each logging its metrics.csv: the fast quickstart, learning rate x seed (once per session;
    read only)."""
    return shared_folder(shared_root, "report-sweep", SWEEP, run_sweep)


@pytest.fixture
def sweep_dir(shared_sweep: Path) -> Path:
    return shared_sweep


def tables(markdown: str) -> Dict[str, List[Dict[str, str]]]:
    """Each ``## section``'s table as dicts by column title (the separator line dropped)."""
    found: Dict[str, List[Dict[str, str]]] = {}
    for section in markdown.split("\n## ")[1:]:
        title, _, body = section.partition("\n")
        lines = [line for line in body.splitlines() if line.startswith("|")]
        if lines:
            header, _separator, *cells = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
                                          for line in lines]
            found[title] = [dict(zip(header, line)) for line in cells]
    return found


def images(markdown: str) -> List[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)


def assert_png(path: Path, size: Tuple[float, float], *, legend: bool = False) -> None:
    """A real PNG of the figure's size in pixels, with something drawn on it; taller by its legend's rows where it
    has a legend below the axes (nli.sweep.plots.legend_below)."""
    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = matplotlib.image.imread(path)
    if legend:
        assert pixels.shape[1] == round(size[0] * plots.DPI) and pixels.shape[0] > round(size[1] * plots.DPI)
    else:
        assert pixels.shape[:2] == (round(size[1] * plots.DPI), round(size[0] * plots.DPI))
    assert pixels.shape[2] in (3, 4) and pixels.std() > 0


def test_a_sweep_report_has_the_rows_the_seeds_means_and_the_plots(shared_sweep: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir = copy_run(shared_sweep, tmp_path / "sweep")  # the report is written into the sweep's folder
    assert report.main([str(sweep_dir)]) == 0
    markdown_file = sweep_dir / report.REPORT
    printed = capsys.readouterr().out.split()
    assert printed == [str(markdown_file), str(sweep_dir / report.DIFFERENCES_CSV), str(sweep_dir / OBJECTIVE_PNG),
                       str(sweep_dir / report.LEARNING_CURVES), str(sweep_dir / RELIABILITY)]
    markdown = markdown_file.read_text()
    rows = {row["job"]: row for row in sweep.read_rows(sweep_dir)}
    parsed = tables(markdown)

    jobs = {int(line["job"]): line for line in parsed["Jobs"]}
    assert sorted(jobs) == sorted(rows) == [0, 1, 2, 3]  # one line per row
    for num, line in jobs.items():
        row = rows[num]
        assert line["state"] == "COMPLETED" and line["optimizer.lr"] == row["optimizer.lr"] in LRS
        assert line["seed"] == row["seed"] and line["objective"] == f"{row['objective']:.4f}"
        assert line["accuracy"] == f"{row['accuracy']:.4f}" and line["seconds"] == f"{row['train_seconds']:.4f}"
    assert "experiment" not in parsed["Jobs"][0]  # the same in every job: not a column

    groups = {line["optimizer.lr"]: line for line in parsed["Over seeds"]}
    assert sorted(groups) == list(LRS)
    for lr, line in groups.items():
        objectives = [row["objective"] for row in rows.values() if row["optimizer.lr"] == lr]
        mean, sd = (float(part) for part in line["objective"].split(" ± "))
        assert line["n"] == "2"
        assert mean == pytest.approx(statistics.mean(objectives), abs=5e-5)
        assert sd == pytest.approx(statistics.stdev(objectives), abs=5e-5)

    assert images(markdown) == [OBJECTIVE_PNG, report.LEARNING_CURVES, RELIABILITY]  # embedded, beside report.md
    assert_png(sweep_dir / OBJECTIVE_PNG, report.OBJECTIVE_SIZE)
    assert_png(sweep_dir / report.LEARNING_CURVES, report.CURVES_SIZE, legend=True)
    assert_png(sweep_dir / RELIABILITY, calibration_plot.size(1), legend=True)  # the synthetic task's one eval split
    assert "in each of 15 equal-width confidence bins" in markdown.split("## Calibration\n\n")[1].splitlines()[0]
    assert "Skipped" not in markdown  # every job logged its metrics.csv


def test_the_per_class_table_is_each_settings_mean_over_seeds(sweep_dir: Path, tmp_path: Path) -> None:
    assert report.main([str(sweep_dir), "--out", str(tmp_path)]) == 0
    lines = tables((tmp_path / report.REPORT).read_text())["Per class"]
    rows = sweep.read_rows(sweep_dir)
    assert len(lines) == len(LRS) * 3  # each setting x the synthetic task's three labels, on its one split
    for line in lines:
        assert line["split"] == "validation" and line["n"] == "2"
        figures = [row["per_class"]["validation"][line["label"]] for row in rows
                   if row["optimizer.lr"] == line["optimizer.lr"]]
        assert line["support"] == str(figures[0]["support"])
        for name in ("precision", "recall", "f1"):
            values = [each[name] for each in figures]
            mean, _, sd = line[name].partition(" ± ")
            assert float(mean) == pytest.approx(statistics.mean(values), abs=5e-5)
            assert float(sd or 0) == pytest.approx(statistics.stdev(values), abs=5e-5)


def test_the_differences_between_settings_are_their_seeds_paired(shared_sweep: Path, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Two learning rates on the same two seeds: one pair, its difference the mean of the seeds' differences,
    in report.md, in report_differences.csv and the sweep's sweep_differences.csv (unrounded) and in the table
    printed at the sweep's end."""
    rows = sweep.read_rows(shared_sweep)
    objective = {(row["optimizer.lr"], row["seed"]): row["objective"] for row in rows}
    expected = statistics.mean(objective[("0.003", seed)] - objective[("0.001", seed)] for seed in ("1", "2"))
    report.write_report([shared_sweep], tmp_path)
    markdown = (tmp_path / report.REPORT).read_text()
    (line,) = tables(markdown)["Differences between settings"]
    assert (line["setting"], line["A"], line["B"], line["n"]) == ("optimizer.lr", "0.001", "0.003", "2 pairs")
    assert line["B - A"] == f"{expected:+.4f}" and line["others alike"] == ""
    with open(tmp_path / report.DIFFERENCES_CSV) as stream:
        (written,) = csv.DictReader(stream)
    assert float(written["difference"]) == pytest.approx(expected) and written["paired"] == "True"
    low, high = float(written["interval_low"]), float(written["interval_high"])
    assert low <= expected <= high
    assert line["95% interval"] == f"[{low:+.4f}, {high:+.4f}]"
    # Two seeds: the paired test's p is at least 2/2^2, so the interval alone can leave 0 out.
    assert float(written["p_value"]) >= 0.5 and line["p"] == f"{float(written['p_value']):.3g}"
    assert line["verdict"] == ("not told apart" if low <= 0 <= high else "interval only: p ≥ 0.05")
    assert "percentile bootstrap over the seeds" in markdown and "permutation test" in markdown

    copy = copy_run(shared_sweep, tmp_path / "sweep")
    (copy / sweep.DIFFERENCES_CSV).unlink()
    with caplog.at_level("INFO", logger=sweep.__name__):
        sweep.report(copy, rows[0][sweep.SWEEP_ID])
    printed = caplog.text
    assert f"Differences between settings ({copy / sweep.DIFFERENCES_CSV})" in printed
    assert "optimizer.lr  0.001  0.003" in printed and line["95% interval"] in printed
    assert (copy / sweep.DIFFERENCES_CSV).read_text() == (tmp_path / report.DIFFERENCES_CSV).read_text()


def test_the_learning_curves_are_each_runs_metrics_csv(sweep_dir: Path) -> None:
    rows = sweep.read_rows(sweep_dir)
    runs, notes = report.load_curves(rows, sweep.varying(rows))
    assert notes == [] and len(runs) == len(rows)
    for (label, curves, metric, setting, objective), row in zip(runs, rows):
        assert label == f"optimizer.lr={row['optimizer.lr']}, seed={row['seed']}"
        assert setting == f"optimizer.lr={row['optimizer.lr']}" and objective == row["objective"]
        assert metric == "eval/accuracy"  # the objective of the synthetic task
        with open(Path(row["output_dir"]) / report.METRICS_CSV) as stream:
            losses = [line.split(",") for line in stream if ",train/loss," in line]
        assert curves["train/loss"] == {int(step): float(value) for step, _, value, _when in losses}
        assert sorted(curves[metric]) == [6, 12]  # FAST evaluates every 6 of 12 steps


def test_a_run_folder_is_a_report_of_one_job(sweep_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = sweep_dir / "1"
    out = tmp_path / "one"
    assert report.main([str(run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.split() == [str(out / report.REPORT), str(out / report.LEARNING_CURVES),
                                               str(out / RELIABILITY)]
    markdown = (out / report.REPORT).read_text()
    (line,) = tables(markdown)["Jobs"]
    assert line["job"] == "0" and line["state"] == "COMPLETED"
    assert line["objective"] == f"{read_results(run)['objective']:.4f}"
    assert "Over seeds" not in markdown and images(markdown) == [report.LEARNING_CURVES, RELIABILITY]  # nothing swept
    assert_png(out / report.LEARNING_CURVES, report.CURVES_SIZE, legend=True)


def test_failed_jobs_are_in_the_tables_and_not_in_the_plots(sweep_dir: Path, tmp_path: Path) -> None:
    """The sweep again with a fifth job that failed, and a job whose folder lost its metrics.csv."""
    copy = tmp_path / "sweep"
    rows = sweep.read_rows(sweep_dir)
    for row in rows:
        (copy / str(row["job"])).mkdir(parents=True)
        if row["job"] != 3:
            shutil.copy(Path(row["output_dir"]) / report.METRICS_CSV, copy / str(row["job"]))
        sweep.record(copy, {**row, "output_dir": str(copy / str(row["job"]))})
    same = [override for override in rows[0]["overrides"] if not override.startswith(("optimizer.lr=", "seed="))]
    sweep.record(copy, sweep.job_row(num=4, state=sweep.FAILED, overrides=[*same, "optimizer.lr=0.1", "seed=1"],
                                     results=None, output_dir=str(copy / "4"), error="error: lr | went\nwrong",
                                     sweep=rows[0]["sweep"], sweep_started=rows[0]["sweep_started"]))

    assert report.main([str(copy)]) == 0
    markdown = (copy / report.REPORT).read_text()
    parsed = tables(markdown)
    assert [line["state"] for line in parsed["Jobs"]] == ["COMPLETED"] * 4 + ["FAILED"]
    assert list(parsed["Jobs"][0]) == ["job", "state", "optimizer.lr", "seed", "objective", "accuracy", "loss",
                                       "ece", "brier", "examples/s", "seconds", "commit", "error"]
    assert parsed["Jobs"][4]["objective"] == "" and parsed["Jobs"][4]["error"] == r"error: lr \| went wrong"
    assert parsed["Jobs"][0]["commit"] == report.short_commit(rows[0]) and parsed["Jobs"][4]["commit"] == ""
    assert {line["optimizer.lr"]: (line["n"], line["failed"]) for line in parsed["Over seeds"]} == {
        "0.001": ("2", "0"), "0.003": ("2", "0"), "0.1": ("0", "1")}
    rows = sweep.read_rows(copy)
    assert set(report.objective_points(rows, "optimizer.lr", [])[""]) == set(LRS)
    runs, notes = report.load_curves(rows, sweep.varying(rows))
    assert [run.label for run in runs] == [f"optimizer.lr={lr}, seed={seed}" for lr, seed in
                                               [("0.001", "1"), ("0.001", "2"), ("0.003", "1")]]
    assert notes == [f"job 3 ({copy / '3' / report.METRICS_CSV}): no {report.METRICS_CSV}"]
    assert f"- {notes[0]}" in markdown


def test_a_pruned_trial_is_in_the_jobs_table_as_pruned_and_in_no_mean_or_plot(sweep_dir: Path, tmp_path: Path) -> None:
    """The sweep again with a fifth job, a search's trial its pruner stopped at step 6 (its results.json says so)."""
    copy = tmp_path / "sweep"
    rows = sweep.read_rows(sweep_dir)
    for row in rows:
        sweep.record(copy, row)
    same = [override for override in rows[0]["overrides"] if not override.startswith(("optimizer.lr=", "seed="))]
    pruned = {**read_results(Path(rows[0]["output_dir"])), "objective": 0.99, "accuracy": 0.99, "status": "pruned",
              "pruned_at": 6}
    sweep.record(copy, sweep.job_row(num=4, state=sweep.COMPLETED, overrides=[*same, "optimizer.lr=0.1", "seed=1"],
                                     results=pruned, output_dir=str(copy / "4"), sweep=rows[0]["sweep"],
                                     sweep_started=rows[0]["sweep_started"]))

    assert report.main([str(copy)]) == 0
    parsed = tables((copy / report.REPORT).read_text())
    assert [line["state"] for line in parsed["Jobs"]] == ["COMPLETED"] * 4 + ["PRUNED"]
    assert {line["optimizer.lr"]: (line["n"], line["pruned"]) for line in parsed["Over seeds"]} == {
        "0.001": ("2", "0"), "0.003": ("2", "0"), "0.1": ("0", "1")}
    assert set(report.objective_points(sweep.read_rows(copy), "optimizer.lr", [])[""]) == set(LRS)
    assert sweep.failed(sweep.read_rows(copy)) == []  # pruned is how a search's trial may end: no failure


def test_a_setting_whose_seeds_have_a_nan_figure_has_no_mean_of_it_and_its_runs_warnings_are_listed(
        sweep_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The sweep again with a setting whose two seeds diverged: their loss is NaN, and one's objective too (as a
    correlation of constant predictions is). Python's statistics raised on a NaN: the sweep's own table was lost
    (Hydra turns a callback's error into a warning) and the report ended in a traceback."""
    copy = tmp_path / "sweep"
    rows = sweep.read_rows(sweep_dir)
    for row in rows:
        sweep.record(copy, row)
    same = [override for override in rows[0]["overrides"] if not override.startswith(("optimizer.lr=", "seed="))]
    diverged = "validation: the model's outputs are NaN or infinite for 96 of 96 examples"
    for seed, objective in ((1, 0.33), (2, math.nan)):
        results = {"objective": objective, "accuracy": objective, "loss": math.nan, "warnings": [diverged]}
        sweep.record(copy, sweep.job_row(num=3 + seed, state=sweep.COMPLETED, results=results,
                                         overrides=[*same, "optimizer.lr=0.1", f"seed={seed}"],
                                         output_dir=str(copy / str(3 + seed)), sweep=rows[0]["sweep"],
                                         sweep_started=rows[0]["sweep_started"]))
    every = sweep.read_rows(copy)
    groups = {group["optimizer.lr"]: group for group in sweep.seed_groups(every)}
    assert math.isnan(groups["0.1"]["loss_mean"]) and math.isnan(groups["0.1"]["objective_mean"])
    assert groups["0.001"]["loss_mean"] == pytest.approx(statistics.fmean(
        row["loss"] for row in rows if row["optimizer.lr"] == "0.001"))  # the other settings' figures stand

    callback = sweep.SweepResults()  # the table a sweep prints as it ends
    callback.sweep_dir, callback.sweep_id = copy, rows[0]["sweep"]
    with caplog.at_level(logging.INFO, logger="nli.sweep.table"):
        callback._report(copy)
    over_seeds = caplog.text[caplog.text.index("Over seeds"):].splitlines()
    assert [line.split()[:3] for line in over_seeds if line.startswith("0.1 ")] == [["0.1", "2", "0"]]

    assert report.main([str(copy)]) == 0
    markdown = (copy / report.REPORT).read_text()
    assert {line["optimizer.lr"]: line["loss"] for line in tables(markdown)["Over seeds"]}["0.1"] == ""
    assert [line for line in markdown.splitlines() if diverged in line] == [
        f"- job {3 + seed} (optimizer.lr=0.1 seed={seed}): {diverged}" for seed in (1, 2)]


def test_the_warnings_of_two_sweeps_name_each_jobs_folder_and_only_the_settings_it_was_given(
        sweep_dir: Path, shared_root: Path, tmp_path: Path) -> None:
    """Two sweeps reported together, each with a job 0 whose model predicts one class: both warnings were under
    "job 0", and the sweep that swept no seed's under "seed=None", a setting it never ran with."""
    other = rerun_sweep(shared_root)
    report.write_report([sweep_dir, other], tmp_path / "report")
    markdown = (tmp_path / "report" / report.REPORT).read_text()
    said = [line.split(": ", 1)[0] for line in markdown.splitlines() if "that class's share" in line]
    ours = [row for row in report.load_rows([sweep_dir]) if row.get("warnings")]
    theirs = [row for row in report.load_rows([other]) if row.get("warnings")]
    assert ours and theirs and len(said) == len(ours) + len(theirs), said
    assert said[:len(ours)] == [f"- job {row['job']} of {sweep_dir.name}/{row['job']} (optimizer.lr="
                                f"{row['optimizer.lr']} seed={row['seed']})" for row in ours]
    assert said[len(ours):] == [f"- job {row['job']} of {other.name}/{row['job']} (optimizer.lr="
                                f"{row['optimizer.lr']})" for row in theirs]


@pytest.mark.process
def test_python_m_nli_report(sweep_dir: Path, tmp_path: Path) -> None:
    """The command as a user types it, in its own process, with a sweep and a run folder at once (a copy of one of
    its jobs, elsewhere: the job's own folder is the sweep's row alone)."""
    run = copy_run(sweep_dir / "0", tmp_path / "runs" / "run")
    proc = subprocess.run([sys.executable, "-m", "nli.report", str(sweep_dir), str(run), "--out", str(tmp_path)],
                          cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == str(tmp_path / report.REPORT)
    jobs = tables((tmp_path / report.REPORT).read_text())["Jobs"]
    # The run folder is job 4, after the sweep's four; the folder column tells the two job 0s apart.
    assert [line["job"] for line in jobs] == ["0", "1", "2", "3", "4"]
    assert (jobs[0]["folder"], jobs[4]["folder"]) == (f"{sweep_dir.name}/0", "runs/run")
    assert jobs[4]["objective"] == jobs[0]["objective"]
    assert proc.stdout.splitlines()[1] == str(tmp_path / report.DIFFERENCES_CSV)
    for name in proc.stdout.splitlines()[2:]:
        assert Path(name).read_bytes()[:8] == PNG_MAGIC


def test_a_sweep_still_running_is_reported_as_such_with_its_jobs_so_far(sweep_dir: Path, tmp_path: Path) -> None:
    """A report of a sweep whose second job was still training said "1 job, 1 completed", and nothing else."""
    running = copy_run(sweep_dir, tmp_path / "running")
    lines = (running / sweep.RESULTS_JSONL).read_text().splitlines()
    (running / sweep.RESULTS_JSONL).write_text("\n".join(lines[:3]) + "\n")  # the fourth job not ended yet
    # The sweep's claim, held by a process that runs (pytest's parent), as a sweep holds it: taken as it started.
    started = json.loads(lines[0])[sweep.SWEEP_STARTED]
    claim(running, started)
    notes: List[str] = []
    report.write_report([running], tmp_path / "report", notes)
    said = f"{running}: the sweep is still running (host {socket.gethostname()}, pid {os.getppid()}"
    assert [note for note in notes if note.startswith(said)], notes
    assert "; 3 job(s) of its 4 jobs have ended, and the report is of those" in notes[-1]
    assert said in (tmp_path / "report" / report.REPORT).read_text()
    (running / sweep.CLAIM.file).unlink()  # the sweep ended (its last row aside): no such note
    notes.clear()
    report.write_report([running], tmp_path / "ended", notes)
    assert not any("still running" in note for note in notes)
    # Another sweep started there since, none of its jobs ended: the rows are the sweep's before it.
    claim(running, started + 60)
    notes.clear()
    report.write_report([running], tmp_path / "next", notes)
    (note,) = notes
    assert note.startswith(f"{running}: a sweep is running there (host {socket.gethostname()}, pid {os.getppid()}")
    assert note.endswith(f"and none of its jobs has ended yet; the report is of the sweep before it (sweep "
                         f"{json.loads(lines[0])[sweep.SWEEP_ID]})")


def test_a_sweep_stopped_part_way_is_reported_with_the_jobs_that_never_ended_said(sweep_dir: Path,
                                                                                  tmp_path: Path) -> None:
    """A sweep stopped after its third job (Ctrl-C, SIGTERM) holds no claim: its report read as a sweep of three."""
    stopped = copy_run(sweep_dir, tmp_path / "stopped")  # multirun.yaml's time kept: written as the sweep started
    lines = (stopped / sweep.RESULTS_JSONL).read_text().splitlines()
    (stopped / sweep.RESULTS_JSONL).write_text("\n".join(lines[:3]) + "\n")
    notes: List[str] = []
    report.write_report([stopped], tmp_path / "report", notes)
    said = f"{stopped}: 3 of the sweep's 4 jobs have ended, and the report is of those: the others never ended"
    assert [note for note in notes if note.startswith(said)], notes
    assert said in (tmp_path / "report" / report.REPORT).read_text()
    notes.clear()
    report.write_report([sweep_dir], tmp_path / "whole", notes)  # every job ended: no such note
    assert not any("never ended" in note for note in notes)


def claim(folder: Path, started: float, file: str = sweep.CLAIM.file) -> None:
    """A sweep's claim of ``folder`` (or a run's, in its ``file``), taken at ``started`` by a process that runs
    (pytest's parent)."""
    now = time.time()
    (folder / file).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid(),
                                                       "started": started, "token": "sweeping", "heartbeat": now}))


def test_a_table_whose_last_line_was_cut_short_is_reported_without_that_line_and_says_so(
        sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A copy or a disk that stopped in the middle of the last row: the report refused every row, pointing at
    "line 1" (its parser's, of the one line it was given)."""
    cut = copy_run(sweep_dir, tmp_path / "cut")
    table = cut / sweep.RESULTS_JSONL
    text = table.read_text()
    table.write_text(text[:len(text) - len(text.splitlines()[-1]) // 2 - 1])  # half the last line, no newline
    assert report.main([str(cut)]) == 0
    err = capsys.readouterr().err
    said = f"{table}: its last line (4) is cut short and left out (that job's folder keeps its results); the 3 rows"
    assert said in err
    assert [line["job"] for line in tables((cut / report.REPORT).read_text())["Jobs"]] == ["0", "1", "2"]
    row = json.loads(text.splitlines()[0])
    sweep.record(cut, {**row, "output_dir": str(cut / "4")})  # the next job to end: recorded after the whole rows
    assert [each["output_dir"] for each in sweep.read_rows(cut)][-1] == str(cut / "4")
    assert len(sweep.read_rows(cut)) == 4


def test_a_table_with_a_damaged_line_before_the_last_is_refused_naming_that_line(
        sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    damaged = copy_run(sweep_dir, tmp_path / "damaged")
    table = damaged / sweep.RESULTS_JSONL
    lines = table.read_text().splitlines()
    table.write_text("\n".join([lines[0], lines[1][:40], *lines[2:]]) + "\n")
    assert report.main([str(damaged)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {table}, line 2: not JSON (") and "Traceback" not in err
    assert "mend or remove that line" in err


def test_a_directory_swept_twice_is_reported_as_its_newest_sweep(shared_root: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The second sweep's two jobs (tests/sweeps/test_sweep.py: rerun_sweep), not the first's under the same job
    numbers, and a line saying the first's were left out."""
    sweep_dir = copy_run(rerun_sweep(shared_root), tmp_path / "sweep")
    every = sweep.read_rows(sweep_dir)
    assert report.main([str(sweep_dir)]) == 0
    err = capsys.readouterr().err
    markdown = (sweep_dir / report.REPORT).read_text()
    jobs = tables(markdown)["Jobs"]
    assert [(line["job"], line["state"], line["optimizer.lr"]) for line in jobs] == [("0", "COMPLETED", "0.001"),
                                                                                    ("1", "FAILED", "0.0005")]
    assert jobs[0]["objective"] == f"{every[2]['objective']:.4f}" and jobs[1]["objective"] == ""
    # The plots' too: the first sweep's job 1 (lr 3e-3, whose run folder 1 holds) is in none.
    assert [row["optimizer.lr"] for row in report.load_rows([sweep_dir])] == ["0.001", "0.0005"]
    left_out = (f"{sweep_dir} holds the rows of 2 sweeps: the report is of the newest (sweep {every[2]['sweep']}); "
                f"the 2 rows of the older ones are left out (they stay in {sweep.RESULTS_JSONL})")
    assert f"\n\n{left_out}.\n\n" in markdown and err == f"note: {left_out}\n"
    assert markdown.startswith("# Sweep report\n\n2 jobs, 1 completed, ")


@pytest.mark.parametrize("kind", ["missing", "empty", "file"])
def test_a_path_that_is_neither_a_sweep_nor_a_run_is_one_line_and_status_2(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / kind
    if kind == "empty":
        path.mkdir()
    elif kind == "file":
        path.write_text("{}")
    assert report.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ") and "Traceback" not in err
    assert "expected a sweep directory (with sweep_results.jsonl) or a run folder (with results.json)" in err
    assert not (path / report.REPORT).exists() and not (tmp_path / report.REPORT).exists()



def stopped_in_its_first_job(args: List[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``train.py -m`` of ``args`` in this process, stopped by SIGTERM at step 3 of its first job, as a scheduler
    stops it: the run checkpoints and exits, and the sweep with it, no job's row written."""
    looked = Revisit.on_step_end

    def on_step_end(self: Revisit, progress: Progress, logged: Any) -> None:
        looked(self, progress, logged)
        if progress.step == 2:  # acted on at the next step's end, where the run checkpoints and stops
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patched:
        patched.setattr(Revisit, "on_step_end", on_step_end)
        proc = run_app(args, cwd=cwd)
    assert proc.returncode == PREEMPTED and "SIGTERM at step 3" in proc.stderr, proc.stdout + proc.stderr


def test_a_sweep_stopped_before_any_job_ended_and_its_jobs_folder_are_said_so_not_to_be_neither(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep stopped by SIGTERM in its first job (its train.py -m in this process, as a scheduler stops it): its
    folder and its job's were each refused as holding "neither sweep_results.jsonl nor results.json", expected to be
    a sweep directory or a run folder, which they are."""
    sweep_dir = tmp_path / "sweep"
    stopped_in_its_first_job(["-m", *FAST, "seed=1,2", f"hydra.sweep.dir={sweep_dir}"], tmp_path, monkeypatch)
    assert not (sweep_dir / sweep.RESULTS_JSONL).exists() and not (sweep_dir / "0" / "results.json").exists()
    capsys.readouterr()
    for path, said in ((sweep_dir, "the sweep there stopped before any of its jobs ended (its multirun.yaml, no "
                                   "sweep_results.jsonl): the same command again runs them"),
                       (sweep_dir / "0", "the run there has not ended (its config.yaml, no results.json): it was "
                                         "stopped, or failed, before its final evaluation")):
        assert report.main([str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {path}: {said}"), err
        assert not (path / report.REPORT).exists()


def test_a_search_stopped_in_its_first_trial_after_a_sweep_in_its_folder_is_said_not_to_have_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A list sweep, then a search into its folder stopped by SIGTERM in its first trial (no row): the report was of
    the list sweep as if it were the folder's last, without a word of the search, whose trial the same command
    resumes."""
    sweep_dir = tmp_path / "sweep"
    listed = run_app(["-m", *FAST, "seed=1", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    (row,) = sweep.read_rows(sweep_dir)
    capsys.readouterr()
    assert report.main([str(sweep_dir)]) == 0 and capsys.readouterr().err == ""  # the list sweep, whole
    copy = shutil.copytree(sweep_dir, tmp_path / "copy", copy_function=shutil.copy)  # its files' times new
    assert report.main([str(copy)]) == 0 and capsys.readouterr().err == ""  # no sweep started there since
    stopped_in_its_first_job(["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=2",
                              f"hydra.sweep.dir={sweep_dir}"], tmp_path, monkeypatch)
    assert sweep.read_rows(sweep_dir) == [row]
    assert report.main([str(sweep_dir)]) == 0
    said = (f"{sweep_dir}: a sweep started there since (multirun.yaml is its record) stopped before any of its 2 "
            f"job(s) ended; the report is of the sweep before it (sweep {row['sweep']}): the same command again runs "
            "that sweep's jobs, one stopped mid-way resuming from its checkpoint")
    assert capsys.readouterr().err == f"note: {said}\n"
    markdown = (sweep_dir / report.REPORT).read_text()
    assert f"\n\n{said}.\n\n" in markdown and [line["job"] for line in tables(markdown)["Jobs"]] == ["0"]


def test_a_search_continued_by_the_same_command_and_stopped_in_its_first_trial_is_said_not_to_have_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A search's second command, the first's again, stopped by SIGTERM in its first trial (trial 1: no row): the
    report was of the first command's trial alone, as if the search were whole, without a word of the trial the same
    command resumes."""
    sweep_dir = tmp_path / "search"
    args = ["-m", *FAST, "hparams_search=quickstart", "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={sweep_dir}"]
    first = run_app(args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    stopped_in_its_first_job(args, tmp_path, monkeypatch)
    assert [row["job"] for row in sweep.read_rows(sweep_dir)] == [0]
    assert (sweep_dir / "trial=1" / "checkpoints").is_dir()  # its checkpoint, for the same command to resume
    capsys.readouterr()
    assert report.main([str(sweep_dir)]) == 0
    said = (f"{sweep_dir}: trial=1: a run that began and never ended, a job of no row of the table (a job's row is "
            "written as it ends: one stopped mid-way by Ctrl-C or SIGTERM has none); the report is of the jobs that "
            "ended, and the command that ran it, run again, resumes it")
    assert capsys.readouterr().err == f"note: {said}\n"
    markdown = (sweep_dir / report.REPORT).read_text()
    assert f"\n\n{said}.\n\n" in markdown and [line["job"] for line in tables(markdown)["Jobs"]] == ["0"]


@pytest.mark.parametrize("file, text, said", [("results.json", "[1, 2]", "results.json is damaged (not a JSON object)"),
                                              ("overrides.yaml", "seed: 1\n", "overrides.yaml is damaged (not a list "
                                                                               "of overrides)")])
def test_a_run_whose_file_is_json_or_yaml_of_another_shape_is_one_line(
        file: str, text: str, said: str, sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A results.json that reads as JSON but is no object (a file replaced by mistake) ended the report, and
    the submission, in a traceback ('list' object has no attribute 'get')."""
    run = shutil.copytree(sweep_dir / "1", tmp_path / "run")
    (run / file).write_text(text)
    assert report.main([str(run), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"error: {run}: {said}: run it again, or leave it out\n"


@pytest.mark.parametrize("under", [False, True])
def test_an_out_that_is_a_file_or_under_one_is_one_line_before_any_work(
        under: bool, sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out a file (or a folder under one) ended, after every job was read, in '[Errno 17] File exists' (or 20,
    'Not a directory'), naming neither the option nor what to give."""
    blocker = tmp_path / "report.md"
    blocker.write_text("an earlier report")
    out = blocker / "lr" if under else blocker
    assert report.main([str(sweep_dir), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: --out {out}: {blocker} is a file, where a folder is needed for "
                                       "report.md and its plots: give --out a folder (made if missing)\n")
    assert blocker.read_text() == "an earlier report"


@pytest.mark.parametrize("what", ["sweep", "run"])
def test_a_sweep_or_run_just_started_is_said_to_be_running_not_to_be_neither(
        what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its first job (or its run) not ended yet, a sweep directory has no table and a run folder no results.json."""
    started = tmp_path / what
    started.mkdir()
    claim(started, time.time(), file=sweep.CLAIM.file if what == "sweep" else CLAIM_FILE)
    assert report.main([str(started)]) == 2
    err = capsys.readouterr().err
    running = (f"a sweep is running there (host {socket.gethostname()}, pid {os.getppid()}" if what == "sweep" else
               f"a run is still going there (host {socket.gethostname()}, pid {os.getppid()}")
    assert err.startswith(f"error: {started}: {running}") and err.count("\n") == 1, err
    assert "holds neither" not in err and not (started / report.REPORT).exists()


def test_a_resumed_runs_repeated_steps_keep_the_last_value(tmp_path: Path) -> None:
    metrics = tmp_path / report.METRICS_CSV
    metrics.write_text("step,metric,value\n5,train/loss,1.0\n10,train/loss,0.9\n10,eval/f1,0.5\n10,eval/accuracy,0.6\n"
                       "10,train/loss,0.8\n10,eval/accuracy,0.7\n15,train/loss,0.6\n")  # resumed from step 5
    curves = report.read_curves(str(metrics))
    assert curves == {"train/loss": {5: 1.0, 10: 0.8, 15: 0.6}, "eval/f1": {10: 0.5}, "eval/accuracy": {10: 0.7}}
    assert report.main_metric({"objective": 0.7}, curves) == "eval/accuracy"  # not the first eval/ metric
    assert report.main_metric({"objective": 0.9, "f1": 0.9}, curves) == "eval/f1"  # results.json's final value
    assert report.main_metric({"objective": 0.1}, curves) == "eval/f1"  # none matches: the first


def test_the_x_axis_of_an_objective_plot() -> None:
    assert report.x_axis(["1e-5", "1e-3"]) == ({"1e-5": 1e-5, "1e-3": 1e-3}, "log")  # more than a factor of 10
    assert report.x_axis(["1e-3", "3e-3"])[1] == "linear"
    assert report.x_axis(["linear", "cosine"]) == ({"linear": 0.0, "cosine": 1.0}, "category")



def test_a_searchs_objective_plot_keeps_its_legend_below_the_points_and_its_ticks_short(tmp_path: Path) -> None:
    """Ten trials of a search, each its own line of one point: the legend of their other values, written to 16
    figures, was drawn over the points (and the figure's layout given up), and each drawn learning rate was a tick
    labelled as typed, the labels run together."""
    lrs = [f"{1e-4 * 1.5 ** i + 1e-9 * i:.19f}" for i in range(10)]  # as a search draws them: 0.0001500000010000000
    ratios = [f"{0.03 + 0.017 * i + 1e-11:.17f}" for i in range(10)]
    rows = [{"job": i, "state": sweep.COMPLETED, "objective": 0.3 + 0.01 * i, "optimizer.lr": lr,
             "schedule.warmup_ratio": ratio} for i, (lr, ratio) in enumerate(zip(lrs, ratios))]
    figure = report.objective_figure(rows, "optimizer.lr", ["schedule.warmup_ratio"], seeds=False)
    path = tmp_path / "objective.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Tight layout not applied"
        plots.save(figure, path)
    (axes,) = figure.axes
    (legend,) = figure.legends  # best first: the trials' objectives grow with their warmup_ratio
    assert [text.get_text() for text in legend.get_texts()][:2] == ["schedule.warmup_ratio=0.183",
                                                                   "schedule.warmup_ratio=0.166"]
    renderer = figure.canvas.get_renderer()
    plotted, named = axes.get_window_extent(renderer), legend.get_window_extent(renderer)
    assert named.y1 <= plotted.y0 and named.y0 >= 0  # below the axes, inside the figure
    assert plotted.height >= 0.5 * report.OBJECTIVE_SIZE[1] * plots.DPI  # the axes kept room for the points
    labels = [label.get_text() for label in axes.get_xticklabels() if label.get_text()]
    assert labels and not any(lr in label for lr in lrs for label in labels), labels  # matplotlib's own ticks
    assert_png(path, tuple(figure.get_size_inches()))
    width, height = figure.get_size_inches()  # the axes' size, and the legend's rows below it
    assert width == report.OBJECTIVE_SIZE[0] and height > report.OBJECTIVE_SIZE[1]


def test_a_run_folder_typed_otherwise_pools_with_its_sweeps_setting(sweep_dir: Path, tmp_path: Path) -> None:
    """A run of one more seed, its command typed as a user types it (1e-3, false, model=tiny), beside the sweep
    whose jobs Hydra wrote back as 0.001 and False: one setting, three seeds, the model column alike. They were two
    settings, and a false train.progress_bar 'setting' and model difference (tiny against the model it resolved)."""
    more = copy_run(sweep_dir / "0", tmp_path / "seed-3")
    typed = [each.replace("optimizer.lr=0.001", "optimizer.lr=1e-3").replace("seed=1", "seed=3")
             for each in SWEEP[1:-2]] + ["optimizer.lr=1e-3", "seed=3", "model=tiny"]
    (more / "overrides.yaml").write_text("".join(f"- {each}\n" for each in typed))
    report.write_report([sweep_dir, more], tmp_path / "report")
    parsed = tables((tmp_path / "report" / report.REPORT).read_text())
    groups = {line["optimizer.lr"]: line for line in parsed["Over seeds"]}
    assert sorted(groups) == list(LRS) and groups["0.001"]["n"] == "3"
    rows = report.load_rows([sweep_dir, more])
    assert {group["optimizer.lr"]: group["seeds"] for group in sweep.seed_groups(rows)} == {"0.001": "1 2 3",
                                                                                             "0.003": "1 2"}
    assert "model" not in parsed["Jobs"][0] and "train.progress_bar" not in parsed["Jobs"][0]  # nothing differs


def test_a_job_folder_given_beside_its_sweep_is_its_jobs_row_alone(sweep_dir: Path, tmp_path: Path) -> None:
    """The sweep and a folder of one of its jobs (``SEARCH SEARCH/trial=0``): the job was listed twice, and counted
    twice wherever seeds were not swept (a search's trials); where they were, the means said seed 1 was in two jobs,
    both the same folder. Now it is the sweep's row alone, either way round, and the report says so."""
    for given in ([sweep_dir, sweep_dir / "0"], [sweep_dir / "0", sweep_dir]):
        notes: List[str] = []
        assert report.load_rows(given, notes) == report.load_rows([sweep_dir])
        assert notes == [f"{sweep_dir / '0'}: a job of the sweep {sweep_dir}, given too: listed once, as the sweep's "
                         "job"]
    report.write_report([sweep_dir, sweep_dir / "0"], tmp_path)
    markdown = (tmp_path / report.REPORT).read_text()
    parsed = tables(markdown)
    assert len(parsed["Jobs"]) == 4 and {line["optimizer.lr"]: line["n"] for line in parsed["Over seeds"]} == \
        {"0.001": "2", "0.003": "2"}
    (pair,) = parsed["Differences between settings"]
    assert pair["n"] == "2 pairs" and "in 2 completed jobs" not in markdown
    assert f"{sweep_dir / '0'}: a job of the sweep {sweep_dir}, given too: listed once" in markdown


def test_a_folder_given_twice_is_read_once(sweep_dir: Path, tmp_path: Path) -> None:
    """``python -m nli.report SWEEP SWEEP/`` listed each job twice, and said of every seed that it was in two jobs
    (the same one), counted once."""
    out = tmp_path / "report"
    assert report.main([str(sweep_dir), f"{sweep_dir}/", "--out", str(out)]) == 0
    markdown = (out / report.REPORT).read_text()
    assert markdown.startswith(f"# Sweep report\n\n4 jobs, 4 completed, from `{sweep_dir}`.\n\n## Jobs"), markdown
    assert sorted(int(line["job"]) for line in tables(markdown)["Jobs"]) == [0, 1, 2, 3]


def test_a_report_leaves_the_sweeps_own_differences_alone_and_no_stale_file_of_its_own(
        sweep_dir: Path, tmp_path: Path) -> None:
    """Written into a sweep's folder, a report of more than that sweep overwrote the sweep's sweep_differences.csv
    with its own pairs; a later report into one folder, of pairs there are none of, left the earlier one's file."""
    copy = copy_run(sweep_dir, tmp_path / "sweep")
    own = (copy / sweep.DIFFERENCES_CSV).read_text()
    report.write_report([copy, copy / "0"], copy)
    assert (copy / sweep.DIFFERENCES_CSV).read_text() == own and (copy / report.DIFFERENCES_CSV).is_file()
    report.write_report([copy / "0"], copy)  # one run: no seeds to pair
    assert not (copy / report.DIFFERENCES_CSV).exists() and (copy / sweep.DIFFERENCES_CSV).read_text() == own


def test_a_job_that_failed_as_it_loaded_is_named_as_its_sweeps_other_jobs(sweep_dir: Path, tmp_path: Path) -> None:
    """The sweep's jobs as if typed with model=tiny, and a fifth that failed before it wrote its config.yaml: the
    others are named by the model they resolved, and so is it, as theirs of the same typed value; it stays in its
    setting's group, where it made a group of its own ('tiny') beside 'roberta from scratch, ...'."""
    copy = copy_run(sweep_dir, tmp_path / "sweep")
    rows = sweep.read_rows(copy)
    (copy / sweep.RESULTS_JSONL).unlink()
    for row in rows:
        sweep.record(copy, {**row, "overrides": [*row["overrides"], "model=tiny"], "model": "tiny",
                            "output_dir": str(copy / str(row["job"]))})
    same = [override for override in rows[0]["overrides"] if not override.startswith(("optimizer.lr=", "seed="))]
    sweep.record(copy, sweep.job_row(num=4, state=sweep.FAILED, results=None, output_dir=str(copy / "4"),
                                     overrides=[*same, "optimizer.lr=0.001", "seed=3", "model=tiny"],
                                     error="error: it broke", sweep=rows[0]["sweep"],
                                     sweep_started=rows[0]["sweep_started"]))
    loaded = report.load_rows([copy])
    assert {row["model"] for row in loaded} == {"roberta from scratch, 2 layers of 128"}
    groups = {group["optimizer.lr"]: (group["n"], group["failed"]) for group in sweep.seed_groups(loaded)}
    assert groups == {"0.001": (2, 1), "0.003": (2, 0)}


# --------------------------------------------------------------- a search continued by a second command, and stopped

# A job of a list sweep, then a grid search of three weight decays whose first command runs two trials and whose second
# (the same command again, n_trials=2) the one point left: the grid runs out after one. Into one hydra.sweep.dir.
LIST_SWEEP = ["-m", *FAST, "optimizer.lr=1e-3"]
GRID_SEARCH = ["-m", *FAST, "hparams_search=quickstart", "hydra/sweeper/sampler=grid",
               "~hydra.sweeper.sampler.n_startup_trials", "hydra.sweeper.n_trials=2", "optimizer.lr=1e-3",
               "train.batch_size=32", "schedule.warmup_ratio=0.1", "optimizer.weight_decay=choice(0.0,0.01,0.1)"]


def continued_search(root: Path) -> Path:
    """The list sweep, then the grid search's two commands, each command's output kept beside (shared, read only)."""

    def make(folder: Path) -> None:
        for name, args in (("list", LIST_SWEEP), ("first", GRID_SEARCH), ("second", GRID_SEARCH)):
            proc = run_app([*args, f"hydra.sweep.dir={folder}"], cwd=root)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            (folder / f"output-{name}.txt").write_text(proc.stdout + proc.stderr)

    return shared_folder(root, "continued-search", [" ".join(LIST_SWEEP), " ".join(GRID_SEARCH)], make)


def test_a_search_continued_by_a_second_command_is_reported_as_its_studys_trials(
        shared_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The report, and the table printed at the second command's end, were of the second command's one trial alone,
    saying the first's rows were left out: the study's best may be one of them. Both take the study's three trials
    (every command's), each once; the list sweep run there before is left out, as it was."""
    sweep_dir = copy_run(continued_search(shared_root), tmp_path / "search")
    listed, *trials = sweep.read_rows(sweep_dir)
    assert [(row["job"], sweep.STUDY in row) for row in [listed, *trials]] == [(0, False), (0, True), (1, True),
                                                                                (2, True)]
    assert len({row["study"] for row in trials}) == 1 and len({row["sweep"] for row in trials}) == 2
    assert report.main([str(sweep_dir)]) == 0
    markdown, err = (sweep_dir / report.REPORT).read_text(), capsys.readouterr().err
    jobs = tables(markdown)["Jobs"]
    assert [(line["job"], line["optimizer.weight_decay"]) for line in jobs] == \
        [(str(row["job"]), row["optimizer.weight_decay"]) for row in trials]
    assert sorted(line["optimizer.weight_decay"] for line in jobs) == ["0.0", "0.01", "0.1"]
    left_out = (f"{sweep_dir} holds the rows of 3 sweeps: the report is of the newest (sweep {trials[-1]['sweep']}) "
                "and the 1 earlier command(s) of its study (study quickstart); the 1 rows of the older ones are left "
                f"out (they stay in {sweep.RESULTS_JSONL})")
    assert err == f"note: {left_out}\n" and f"\n\n{left_out}.\n\n" in markdown  # the grid ran out: none stopped
    assert markdown.startswith("# Sweep report\n\n3 jobs, 3 completed, ")

    # The table printed at the second command's end, and its sweep_results.csv: the study's trials too.
    output = (sweep_dir / "output-second.txt").read_text()
    printed = output[output.index("Sweep results"):output.index("The sweep's files")].splitlines()[2:-1]  # its jobs
    assert [line.split()[:2] for line in printed] == [[str(row["job"]), "COMPLETED"] for row in trials], printed
    with open(sweep_dir / sweep.RESULTS_CSV) as stream:
        assert [line["job"] for line in csv.DictReader(stream)] == ["0", "1", "2"]


def test_a_search_stopped_part_way_is_reported_with_the_trials_that_never_ended_said(
        shared_root: Path, tmp_path: Path) -> None:
    """A search stopped between trials (Ctrl-C, SIGTERM: no claim left) was reported as if whole: the note a list sweep
    gets was skipped for every search, as a grid search may end before its n_trials. Here the second command ran one
    of the two trials it had to run (its grid's two points the first command had not tried: the first's second row
    is taken out, as if it had run one trial), and the note says so, of the search's trials; the grid that ran out
    (test above) has none."""
    stopped = copy_run(continued_search(shared_root), tmp_path / "stopped")  # multirun.yaml's time kept
    lines = (stopped / sweep.RESULTS_JSONL).read_text().splitlines()
    (stopped / sweep.RESULTS_JSONL).write_text("\n".join([*lines[:2], lines[3]]) + "\n")
    notes: List[str] = []
    report.write_report([stopped], tmp_path / "report", notes)
    said = (f"{stopped}: 1 of the 2 trials of the search's last command have ended, and the report is of those, with "
            "the study's 1 trials of earlier commands: the others never ended (the search was stopped, or they still "
            "run under a launcher elsewhere); the same command again continues its study, first resuming a trial "
            "stopped mid-way, if any")
    assert said in notes, notes
    assert said in (tmp_path / "report" / report.REPORT).read_text()
    assert [line["job"] for line in tables((tmp_path / "report" / report.REPORT).read_text())["Jobs"]] == ["0", "2"]


# ------------------------------------------------------------------- many runs: a 3x3x3 grid, a search's 50 trials


def made_sweep(folder: Path, settings: List[Dict[str, str]], seeds: int = 1) -> List[Dict[str, object]]:
    """A sweep's table of every setting x seed, each job's folder with a metrics.csv (a loss every 3 of 30 steps, an
    evaluation every 10) and its calibration; the objectives spread so that each setting's mean differs."""
    folder.mkdir(parents=True)
    num = 0
    for i, setting in enumerate(settings):
        for seed in range(1, seeds + 1):
            job = folder / str(num)
            job.mkdir()
            objective = 0.5 + 0.4 * i / len(settings) + 0.001 * seed
            lines = ["step,metric,value"]
            lines += [f"{step},{name},{value}" for step in range(3, 31, 3) for name, value in
                      (("train/loss", 1 / step + 0.01 * seed), ("train/lr", 1e-4 * (1 - step / 30)),
                       ("train/grad_norm", 0.5 + 0.01 * i))]
            lines += [f"{step},eval/accuracy,{objective * step / 30}" for step in (10, 20, 30)]
            (job / report.METRICS_CSV).write_text("\n".join(lines) + "\n")
            bins = {"bins": 15, "count": [3, 5], "confidence": [0.45, 0.95], "accuracy": [0.6, objective], "ece": 0.1}
            results = {"objective": objective, "accuracy": objective, "calibration": {"validation": bins}}
            overrides = [f"{key}={value}" for key, value in setting.items()] + [f"seed={seed}"] * (seeds > 1)
            sweep.record(folder, sweep.job_row(num=num, state=sweep.COMPLETED, overrides=overrides, results=results,
                                               output_dir=str(job), sweep="made", sweep_started=1.0))
            num += 1
    return sweep.read_rows(folder)


GRID = [{"optimizer.lr": lr, "optimizer.weight_decay": decay} for lr in ("1e-05", "3e-05", "0.0001")
        for decay in ("0.0", "0.01", "0.1")]


def legend_geometry(figure: matplotlib.figure.Figure) -> Tuple[matplotlib.legend.Legend, List[object]]:
    """The figure's one legend (below its axes, none in them), and its axes' full extents (ticks and labels too)."""
    plots.save(figure, Path(os.devnull))  # laid out as the PNG is
    renderer = figure.canvas.get_renderer()
    (legend,) = figure.legends
    assert all(axes.get_legend() is None for axes in figure.axes)
    return legend, [axes.get_tightbbox(renderer) for axes in figure.axes if axes.get_visible()]


def assert_below_and_inside(figure: matplotlib.figure.Figure) -> matplotlib.legend.Legend:
    legend, boxes = legend_geometry(figure)
    box = legend.get_window_extent(figure.canvas.get_renderer())
    width, height = figure.get_size_inches() * figure.dpi
    assert all(box.y1 <= each.y0 for each in boxes), (box, boxes)  # below every axes, ticks and labels included
    assert 0 <= box.x0 and box.x1 <= width and 0 <= box.y0 and box.y1 <= height  # all of it in the figure
    return legend


def axes_inches(figure: matplotlib.figure.Figure) -> List[Tuple[float, float]]:
    return [(round(axes.get_position().width * figure.get_size_inches()[0], 1),
             round(axes.get_position().height * figure.get_size_inches()[1], 1)) for axes in figure.axes]


def test_the_learning_curves_of_a_3x3x3_sweep_name_each_setting_once_below_the_axes(tmp_path: Path) -> None:
    """27 runs, 9 settings of 3 seeds: a legend of 27 lines covered the axes (and past 12 was left out). Now a line
    and band per setting, the seeds' mean and range, named once in a legend below the axes; the figure taller by
    the legend, the axes as large as a single run's."""
    rows = made_sweep(tmp_path / "grid", GRID, seeds=3)
    runs, notes = report.load_curves(rows, sweep.varying(rows))
    assert len(runs) == 27 and notes == []
    figure = report.curves_figure(runs)
    legend = assert_below_and_inside(figure)
    labels = [text.get_text() for text in legend.get_texts()]
    assert len(labels) == 9 and labels[0] == "optimizer.lr=0.0001, optimizer.weight_decay=0.1 (3 seeds)"  # the best
    loss_axes = figure.axes[0]
    assert len(loss_axes.get_lines()) == 9 and len(loss_axes.collections) == 9  # a line and a band a setting
    assert figure.get_size_inches()[0] == report.CURVES_SIZE[0] and figure.get_size_inches()[1] > report.CURVES_SIZE[1]
    alone = report.curves_figure(runs[:1])
    legend_geometry(alone)
    assert axes_inches(figure) == axes_inches(alone)  # the legend's rows took no room from the axes


def test_the_learning_curves_of_a_search_colour_the_best_five_trials_and_the_rest_grey(tmp_path: Path) -> None:
    lrs = [f"{1e-5 * 1.1 ** i + 1e-12:.19f}" for i in range(50)]  # as a search draws them
    rows = made_sweep(tmp_path / "search", [{"optimizer.lr": lr} for lr in lrs])
    figure = report.curves_figure(report.load_curves(rows, sweep.varying(rows))[0])
    legend = assert_below_and_inside(figure)
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == [f"optimizer.lr={float(lr):.3g}" for lr in reversed(lrs[-5:])]  # best first, 3 figures
    assert legend.get_title().get_text().startswith("the best 5 of 50 settings by objective; the others grey")
    colours = [line.get_color() for line in figure.axes[0].get_lines()]
    assert len(colours) == 50 and colours.count(plots.GREY) == 45


def test_settings_rank_by_their_mean_objective_the_lowest_first_where_the_sweep_minimized() -> None:
    objectives = {"a": [0.2, 0.4], "b": [0.1], "none": [math.nan], "c": [0.5]}
    assert plots.ranked(objectives) == ["c", "a", "b", "none"]
    assert plots.ranked(objectives, plots.MINIMIZE) == ["b", "a", "c", "none"]  # no number: last either way


def test_the_report_of_a_search_that_minimized_names_its_lowest_trial_its_best(tmp_path: Path) -> None:
    """A search with hydra.sweeper.direction=minimize picks its lowest trial (optimization_results.yaml); the report
    took the highest objective for the best whatever the search sought, naming first (and past 10 lines colouring,
    past 10 runs drawing the reliability of) the trials the search judged its worst."""
    sweep_dir = tmp_path / "search"
    done = run_app(["-m", *FAST, "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=2",
                    "hydra.sweeper.direction=minimize", "optimizer.lr=choice(1e-5,3e-3)",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = report.load_rows([sweep_dir])
    lowest = min(rows, key=lambda row: row["objective"])
    assert len({row["objective"] for row in rows}) == 2, rows  # the two learning rates end apart
    assert yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())["best_value"] == lowest["objective"]
    direction = report.sweep_direction([sweep_dir], [])
    figure = report.curves_figure(report.load_curves(rows, sweep.varying(rows))[0], direction)
    (legend,) = figure.legends
    assert legend.get_texts()[0].get_text() == plots.short_label(f"optimizer.lr={lowest['optimizer.lr']}")  # best first
    text = report.write_report([sweep_dir])[0].read_text()
    assert "The sweep minimized its objective (`hydra.sweeper.direction=minimize`): the plots' best are the runs " \
        "of the lowest objective." in text


def test_the_learning_curves_of_a_search_that_minimized_colour_its_lowest_five(tmp_path: Path) -> None:
    lrs = [f"{1e-5 * 1.1 ** i + 1e-12:.19f}" for i in range(50)]  # the objective grows with the learning rate
    rows = made_sweep(tmp_path / "search", [{"optimizer.lr": lr} for lr in lrs])
    figure = report.curves_figure(report.load_curves(rows, sweep.varying(rows))[0], plots.MINIMIZE)
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == [f"optimizer.lr={float(lr):.3g}" for lr in lrs[:5]]
    assert legend.get_title().get_text() == "the lowest 5 of 50 settings by objective; the others grey"


def test_the_objective_plot_cuts_long_values_in_its_legend_and_ticks(tmp_path: Path) -> None:
    """Long override values (data files' paths) in the legend ran past the figure's edge, and as category ticks
    ran into each other."""
    paths = [f"/datasets/nli/mnli/very/long/folder/of/the/split/train_version_{i}.jsonl" for i in range(6)]
    rows = made_sweep(tmp_path / "files", [{"data.files.train": path, "optimizer.lr": lr} for path in paths
                                           for lr in ("1e-05", "3e-05")])
    figure = report.objective_figure(rows, "data.files.train", ["optimizer.lr"], seeds=False)
    legend = assert_below_and_inside(figure)
    assert [text.get_text() for text in legend.get_texts()] == ["optimizer.lr=3e-05", "optimizer.lr=1e-05"]
    axes = figure.axes[0]
    ticks = [label for label in axes.get_xticklabels() if label.get_text()]
    assert len({label.get_text() for label in ticks}) == 6  # still told apart: the files' names kept
    assert all(len(label.get_text()) <= plots.TICK_CHARS and label.get_text().endswith(".jsonl") for label in ticks)
    renderer = figure.canvas.get_renderer()
    assert all(label.get_rotation() == plots.SLANT for label in ticks)  # level, they ran into each other
    apart = axes.transData.transform((1, 0))[0] - axes.transData.transform((0, 0))[0]  # pixels from tick to tick
    tall = max(label.get_fontsize() for label in ticks) * figure.dpi / 72  # a line of a label's text, in pixels
    level = max(label.get_window_extent(renderer).width for label in ticks)  # slanted: wider than the text is long
    assert apart * math.sin(math.radians(plots.SLANT)) >= tall and level > apart  # slanted, they stand apart

    legend = assert_below_and_inside(report.objective_figure(rows, "optimizer.lr", ["data.files.train"], seeds=False))
    labels = [text.get_text() for text in legend.get_texts()]
    assert len(labels) == 6 and all(len(line) <= plots.LABEL_CHARS for label in labels for line in label.split("\n"))
    assert len(set(labels)) == 6 and all(label.endswith(".jsonl") for label in labels)


def test_a_report_written_again_into_its_folder_removes_its_own_plots_it_no_longer_has(tmp_path: Path) -> None:
    """A report of two swept settings, then one of a sweep of one into the same --out: the first one's plot of the
    setting there is no more stayed beside the new report.md. A user's file there stays, a PNG of the same name
    pattern included, as long as no report.md showed it."""
    two = made_sweep(tmp_path / "two", GRID[:4])  # optimizer.lr and optimizer.weight_decay
    one = made_sweep(tmp_path / "one", GRID[:3])  # optimizer.weight_decay alone
    out = tmp_path / "report"
    out.mkdir()
    mine = [out / "objective_vs_my_notes.png", out / "diagram.png", out / "notes.md"]
    for path in mine:
        path.write_bytes(b"a user's")
    first = report.write_report([tmp_path / "two"], out)
    assert out / "objective_vs_optimizer.lr.png" in first and out / "objective_vs_optimizer.weight_decay.png" in first
    second = report.write_report([tmp_path / "one"], out)
    assert {path.name for path in out.iterdir()} == {path.name for path in [*second, *mine]}
    assert not (out / "objective_vs_optimizer.lr.png").exists() and len(two) == 4 and len(one) == 3
    assert all(path.read_bytes() == b"a user's" for path in mine)


def test_a_metrics_row_cut_short_names_its_file_and_line(tmp_path: Path) -> None:
    """A metrics.csv whose last row a full disk cut short (written before the csv logger took such a row back) made
    the report fail with a TypeError (float(None)); now the run's curves are left out with a note naming the file
    and its line, and the report goes on."""
    metrics = tmp_path / "run" / "metrics.csv"
    metrics.parent.mkdir()
    metrics.write_text("step,metric,value,wall_time\n3,train/loss,0.5,1.0\n6,train/lo")
    with pytest.raises(ValueError, match=re.escape(f"{metrics}, line 3: not a row of step, metric and value "
                                                   "('6,train/lo')")):
        report.read_curves(str(metrics))
    runs, notes = report.load_curves([{"job": 0, "state": "COMPLETED", "objective": 0.5,
                                       "output_dir": str(metrics.parent)}], [])
    assert runs == [] and len(notes) == 1 and f"job 0 ({metrics}): metrics.csv unreadable" in notes[0]
    assert "line 3: not a row of step, metric and value" in notes[0]


def test_the_learning_curves_of_a_sweep_of_seeds_alone_are_one_setting(tmp_path: Path) -> None:
    """Seeds alone swept: one line and band, named by its seeds (it was 'all seeds (3 seeds)')."""
    rows = made_sweep(tmp_path / "seeds", [{}], seeds=3)
    assert sweep.varying(rows) == ["seed"]
    figure = report.curves_figure(report.load_curves(rows, ["seed"])[0])
    legend = assert_below_and_inside(figure)
    assert [text.get_text() for text in legend.get_texts()] == ["3 seeds"]
    assert len(figure.axes[0].get_lines()) == 1 and len(figure.axes[0].collections) == 1
