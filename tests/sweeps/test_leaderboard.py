"""`python -m nli.report submission` (nli/sweep/leaderboard.py): GLUE's submission zip from real runs' test
predictions, read back with zipfile as GLUE's server reads it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

from nli.config.paths import GLUE_HUB
from nli.config.schema import DIAGNOSTIC_SPLIT, config_dir, task_config
from nli.contract import PREDICTIONS_DIR, RESULTS_FILE
from nli.evaluate.evaluation import Predictions
from nli.output.submission import submission
from nli.sweep import leaderboard
from tests.runs.test_glue import TINY, mnli_dir
from tests.support.diskfull import full, needs_full
from tests.support.runs import GLUE_DATA, read_results, run_app

RTE_SWEEP = ["-m", "task=rte", f"data.dir={GLUE_DATA}", *TINY, "train.max_steps=4", "train.eval_every=2",
             "train.predict=true", "optimizer.lr=1e-3,3e-2"]


def test_the_files_it_expects_are_the_ones_the_glue_tasks_write() -> None:
    tasks = [path.stem for path in (config_dir() / "task").glob("*.yaml")]
    written: Dict[str, str] = {}
    for task in map(task_config, tasks):
        if task.hub_dataset == GLUE_HUB:
            splits = [*task.test_splits, *([DIAGNOSTIC_SPLIT] if task.diagnostic else [])]
            written.update({f"{task.submission_file(split)}.tsv": task.name for split in splits})
    assert written == {name: task for name, (task, _) in leaderboard.GLUE_FILES.items()}


def test_the_zip_takes_each_tasks_best_run_and_says_what_glue_would_refuse(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir, mnli = tmp_path / "rte-sweep", tmp_path / "mnli"
    assert run_app([*RTE_SWEEP, f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path).returncode == 0
    proc = run_app(["task=mnli", f"data.dir={mnli_dir(tmp_path / 'glue')}", *TINY, "train.max_steps=4",
                    "train.predict=true", f"hydra.run.dir={mnli}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    objectives = [read_results(sweep_dir / job)["objective"] for job in ("0", "1")]
    best = sweep_dir / str(objectives.index(max(objectives)))  # the first, of equals

    out = tmp_path / "submission.zip"
    assert leaderboard.main([str(sweep_dir), str(mnli), "--out", str(out)]) == 1
    said = capsys.readouterr()
    with zipfile.ZipFile(out) as archive:
        assert sorted(archive.namelist()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "RTE.tsv"]
        assert archive.read("RTE.tsv") == (best / PREDICTIONS_DIR / "RTE.tsv").read_bytes()
        for name in ("MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"):
            assert archive.read(name) == (mnli / PREDICTIONS_DIR / name).read_bytes()
    assert said.out.splitlines()[0] == f"{out}: 4 of GLUE's 11 files"
    assert f"  RTE.tsv      {best}  objective {max(objectives):.4f} (the best of 2 runs)" in said.out
    assert f"  AX.tsv       {mnli}  objective {read_results(mnli)['objective']:.4f}" in said.out
    refused = said.err.splitlines()
    assert refused[0] == "GLUE would not take this zip as it is:"
    assert "  CoLA.tsv: no run of cola given wrote it (train.predict=true writes it)" in refused
    assert "  RTE.tsv: 1,384 predictions, where GLUE's test set has 3,000 examples (a run on a part of it, or on " \
           "other data)" in refused  # the suite's RTE test file is a re-split, not GLUE's
    assert "  AX.tsv: 7 predictions, where GLUE's test set has 1,104 examples (a run on a part of it, or on other " \
           "data)" in refused
    assert len(refused) == 1 + 7 + 4  # seven tasks no run wrote, four files of the wrong size

    # A chosen run that lacks one of its task's files: said, not filled from another run of another model.
    shutil.copytree(mnli, tmp_path / "mnli-better")
    (tmp_path / "mnli-better" / PREDICTIONS_DIR / "AX.tsv").unlink()
    results = read_results(mnli)
    (tmp_path / "mnli-better" / RESULTS_FILE).write_text(json.dumps({**results, "objective": 1.0}))
    assert leaderboard.main([str(mnli), str(tmp_path / "mnli-better"), "--out", str(out)]) == 1
    assert f"  AX.tsv: the chosen run of mnli, {tmp_path / 'mnli-better'}, did not write it" in \
        capsys.readouterr().err.splitlines()
    with zipfile.ZipFile(out) as archive:
        assert sorted(archive.namelist()) == ["MNLI-m.tsv", "MNLI-mm.tsv"]


def glue_sized_runs(root: Path) -> List[Path]:
    """One folder per GLUE task holding what a run with train.predict=true leaves for the zip: its results.json
    and its predictions, written by the run's own writer for test sets of GLUE's sizes."""
    folders = []
    for task in {task for task, _ in leaderboard.GLUE_FILES.values()}:
        config = task_config(task)
        folder = root / task
        (folder / PREDICTIONS_DIR).mkdir(parents=True)
        (folder / RESULTS_FILE).write_text(json.dumps({"objective": 0.5, "status": "COMPLETED"}))
        for split in [*config.test_splits, *([DIAGNOSTIC_SPLIT] if config.diagnostic else [])]:
            size = leaderboard.GLUE_FILES[f"{config.submission_file(split)}.tsv"][1]
            values = np.zeros(size, dtype=np.float32 if config.is_regression else np.int64)
            name, text = submission(config, split, Predictions(values, np.full(size, -1), np.arange(size)))
            (folder / PREDICTIONS_DIR / name).write_text(text)
        folders.append(folder)
    return folders


def test_a_whole_submission_is_written_and_the_command_ends_with_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "glue.zip"
    assert leaderboard.main([*map(str, glue_sized_runs(tmp_path / "runs")), "--out", str(out)]) == 0
    with zipfile.ZipFile(out) as archive:
        assert sorted(archive.namelist()) == sorted(leaderboard.GLUE_FILES)
        assert archive.read("QQP.tsv").decode().count("\n") == 390_965 + 1
    said = capsys.readouterr()
    assert said.out.startswith(f"{out}: 11 of GLUE's 11 files\n") and said.err == ""


def test_nothing_to_zip_is_one_line_and_no_zip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = glue_sized_runs(tmp_path / "runs")[0]
    shutil.rmtree(run / PREDICTIONS_DIR)
    out = tmp_path / "glue.zip"
    assert leaderboard.main([str(run), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: no completed run of {run} wrote GLUE test predictions: train with "
                                       "train.predict=true, or evaluate a trained model with eval.only=true "
                                       "train.predict=true\n")
    assert not out.exists() and not list(tmp_path.glob(".glue.zip*"))
    assert leaderboard.main([str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert "nowhere: no such directory" in capsys.readouterr().err
    elsewhere = tmp_path / "no-folder" / "glue.zip"
    assert leaderboard.main([str(run), "--out", str(elsewhere)]) == 2
    assert capsys.readouterr().err == (f"error: --out {elsewhere}: the folder {elsewhere.parent} does not exist: "
                                       "make it, or give another path\n")



def test_an_out_that_is_a_folder_or_under_a_file_is_one_line_before_any_run_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out a folder wrote the zip's temporary, then ended in '[Errno 21] Is a directory'; --out under a file said
    that file's folder 'does not exist'."""
    run = glue_sized_runs(tmp_path / "runs")[0]
    folder, blocker = tmp_path / "zips", tmp_path / "a-file"
    folder.mkdir()
    blocker.write_text("not a folder")
    assert leaderboard.main([str(run), "--out", str(folder)]) == 2
    assert capsys.readouterr().err == (f"error: --out {folder} is a folder: give the zip's file name (e.g. "
                                       f"{folder / leaderboard.DEFAULT_OUT})\n")
    assert not list(folder.iterdir()) and not list(tmp_path.glob(".zips*"))
    assert leaderboard.main([str(run), "--out", str(blocker / "glue.zip")]) == 2
    assert capsys.readouterr().err == (f"error: --out {blocker / 'glue.zip'}: {blocker} is a file, not a folder: give "
                                       "another path\n")



def test_an_out_that_is_a_file_not_a_zip_is_kept_and_refused(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``--out RUN/predictions/RTE.tsv`` (a run's file named as the zip) replaced that file with the zip."""
    run = next(run for run in glue_sized_runs(tmp_path / "runs") if run.name == "rte")
    tsv = run / PREDICTIONS_DIR / "RTE.tsv"
    before = tsv.read_bytes()
    assert leaderboard.main([str(run), "--out", str(tsv)]) == 2
    instead = tsv.with_name("glue_submission.zip")
    assert capsys.readouterr().err == (f"error: --out {tsv} is a file that is not a zip: the submission replaces only "
                                       f"an earlier zip; give a new name (e.g. {instead})\n")
    assert tsv.read_bytes() == before
    out = tmp_path / "glue.zip"  # an earlier submission is replaced, as before
    assert leaderboard.main([str(run), "--out", str(out)]) == 1 and leaderboard.main([str(run), "--out", str(out)]) == 1


def test_a_whole_submission_is_not_replaced_by_one_glue_would_not_take(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The same command given fewer runs than the last (one task's, to check it) replaced a zip of GLUE's eleven
    files with one of two, and ended 1: the submission that was ready was lost."""
    runs, out = glue_sized_runs(tmp_path / "runs"), tmp_path / "glue.zip"
    assert leaderboard.main([*map(str, runs), "--out", str(out)]) == 0
    ready, _ = out.read_bytes(), capsys.readouterr()
    rte = next(run for run in runs if run.name == "rte")
    assert leaderboard.main([str(rte), "--out", str(out)]) == 1
    said = capsys.readouterr()
    assert out.read_bytes() == ready and not list(tmp_path.glob(".glue.zip*")) and said.out == ""
    assert said.err.startswith(f"{out} is kept: it holds GLUE's 11 files, and this zip of 1, which GLUE would not "
                               "take, would replace it. Give --out another name to write this one\n"
                               "GLUE would not take this zip as it is:\n")
    assert leaderboard.main([*map(str, runs), "--out", str(out)]) == 0  # a whole one replaces it


@needs_full
def test_a_zip_the_disk_will_not_take_is_said_of_out_and_leaves_no_file(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A zip the disk refused was said of its temporary file ('[Errno 28] No space left on device: .glue.zip.123')."""
    rte = next(run for run in glue_sized_runs(tmp_path / "runs") if run.name == "rte")
    out = tmp_path / "glue.zip"
    full(tmp_path / f".glue.zip.{os.getpid()}")  # where the zip is written first
    assert leaderboard.main([str(rte), "--out", str(out)]) == 1
    assert capsys.readouterr().err == (f"error: --out {out} could not be written: no space left on its disk: make room "
                                       "there and run the same command again (what was saved is kept)\n")
    assert not out.exists() and not list(tmp_path.glob(".glue.zip*"))


def test_a_file_that_is_not_utf8_is_said_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A predictions file changed since its run wrote it (saved in another encoding) ended in a UnicodeDecodeError."""
    rte = next(run for run in glue_sized_runs(tmp_path / "runs") if run.name == "rte")
    tsv = rte / PREDICTIONS_DIR / "RTE.tsv"
    tsv.write_bytes(tsv.read_bytes()[:20] + b"\xff" + tsv.read_bytes()[20:])
    out = tmp_path / "glue.zip"
    assert leaderboard.main([str(rte), "--out", str(out)]) == 1
    said = capsys.readouterr().err.splitlines()
    assert f"  RTE.tsv: {tsv} is not UTF-8 text (byte 20): changed since the run wrote it; predict again " \
           "(eval.only=true train.predict=true)" in said
    with zipfile.ZipFile(out) as archive:
        assert archive.namelist() == []


def test_a_run_given_twice_is_one_run_not_the_best_of_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = next(run for run in glue_sized_runs(tmp_path / "runs") if run.name == "rte")
    out = tmp_path / "glue.zip"
    assert leaderboard.main([str(run), str(run), "--out", str(out)]) == 1  # one task of GLUE's nine
    assert f"  RTE.tsv      {run}  objective 0.5000\n" in capsys.readouterr().out


def test_a_sweep_given_with_one_of_its_jobs_counts_that_job_once(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``submission SWEEP SWEEP/0`` (a sweep, and the job a researcher looked at): its row and its folder were two
    runs, and the zip's one RTE run 'the best of 2 runs'."""
    sweep_dir = tmp_path / "rte-sweep"
    assert run_app([*RTE_SWEEP[:-1], "optimizer.lr=1e-3", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path).returncode == 0
    out = tmp_path / "glue.zip"
    assert leaderboard.main([str(sweep_dir), str(sweep_dir / "0"), "--out", str(out)]) == 1  # RTE alone
    printed = capsys.readouterr().out
    assert f"  RTE.tsv      {sweep_dir / '0'}  objective {read_results(sweep_dir / '0')['objective']:.4f}\n" in printed


@pytest.mark.process
def test_python_m_nli_report_submission_is_this_command(tmp_path: Path) -> None:
    run = glue_sized_runs(tmp_path / "runs")[0]
    shutil.rmtree(run / PREDICTIONS_DIR)
    proc = subprocess.run([sys.executable, "-m", "nli.report", "submission", str(run)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: no completed run of {run} wrote GLUE test "), \
        proc.stderr
