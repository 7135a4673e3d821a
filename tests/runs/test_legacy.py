"""Folders that the code wrote before ``nli/`` became packages (tests/data/legacy/, made by commit 056a8d0) keep
working with today's code: a stopped run resumes as if never stopped, a finished one continues with
``train.accept_changes`` and evaluates to what it recorded, a sweep reports as it did and its command, run
again, answers from its jobs' folders. Their configs name the class paths of that layout, and they ran on the
synthetic task's version 1 (from before ``data.synthetic_version``): their commands go on with it typed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Iterator, List

import torch
import yaml
from hydra.utils import get_object
from safetensors.torch import load_file

from nli.sweep import report
from tests.support.runs import MEASURED, ROOT, copy_run, read_results, run_app

LEGACY = ROOT / "tests" / "data" / "legacy"
OLD_TASK = "data.synthetic_version=1"  # the synthetic task these folders trained on


def overrides(folder: Path) -> List[str]:
    """The command that made ``folder``, as its own ``overrides.yaml`` recorded it, on the task it ran on."""
    return [*yaml.safe_load((folder / "overrides.yaml").read_text()), OLD_TASK]


def figures(results: Dict[str, Any]) -> Dict[str, Any]:
    """What a run computes: results.json less what it measures (time, memory) and where it ran."""
    return {key: value for key, value in results.items() if key not in MEASURED}


def run(args: List[str], cwd: Path) -> str:
    proc = run_app(args, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def without_folder(report_md: str) -> str:
    """A report less the folder it names (where the sweep was when it was reported)."""
    return re.sub(r"from `[^`]*`", "from SWEEP", report_md)


def class_paths(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "_target_":
                yield value
            yield from class_paths(value)
    elif isinstance(node, list):
        for value in node:
            yield from class_paths(value)


def test_every_class_path_the_old_folders_recorded_still_resolves() -> None:
    recorded = [*LEGACY.glob("*/config.yaml"), *LEGACY.glob("sweep/*/config.yaml"), LEGACY / "sweep" / "multirun.yaml"]
    paths = {path for file in recorded for path in class_paths(yaml.safe_load(file.read_text()))}
    assert {"nli.optim.linear", "nli.tracking.CsvTracker", "nli.sweep.SweepResults"} <= paths
    for path in paths:
        assert callable(get_object(path)), path


def test_a_run_stopped_by_the_old_code_resumes_to_the_old_codes_uninterrupted_run(tmp_path: Path) -> None:
    """run-finished is run-stopped's command run through by the old code."""
    stopped = copy_run(LEGACY / "run-stopped", tmp_path / "run")
    log = run([*overrides(stopped), f"hydra.run.dir={stopped}"], tmp_path)
    assert re.search(r"resuming from checkpoint .*step-000008: step 8 of 20", log), log
    # Its metrics.csv goes on in the columns it has (step,metric,value: no wall_time before it existed).
    rows = (stopped / "metrics.csv").read_text().splitlines()
    assert rows[0] == "step,metric,value" and {line.count(",") for line in rows} == {2} and len(rows) > 20
    whole = LEGACY / "run-finished"
    ours = figures(read_results(stopped))
    # What today's code says of the same model that the old code did not: it predicts one class (results.json's
    # warnings, nli.evaluate.per_class.one_class), how well calibrated it is (nli.evaluate.reliability), the task
    # it resolved, and the steps whose update was skipped (none); the figures are the old code's.
    assert [warning.split(":")[0] for warning in ours.pop("warnings")] == ["validation"]
    assert ours.pop("task") == "synthetic" and ours.pop("train_skipped_steps") == 0
    assert set(ours.pop("calibration")) == {"validation"} and ours.pop("ece") >= 0 and ours.pop("brier") >= 0
    assert ours == figures(read_results(whole))
    ours, theirs = (load_file(folder / "model" / "model.safetensors") for folder in (stopped, whole))
    assert ours.keys() == theirs.keys()
    # Recorded with oneDNN pinned to AVX2 (tests/data/legacy/make.py) but MKL's and torch's own kernels as an
    # AMD EPYC picked them: bit for bit there; an Intel CPU with AVX-512 and AMX picks other paths, and the same
    # steps differ at float rounding (measured: at most 4e-9), with every metric above still equal to the last
    # bit. A resume that went wrong (the order, the rate, a generator) moves weights by an update's size, 1e-4 and more.
    for key, tensor in theirs.items():
        torch.testing.assert_close(ours[key], tensor, rtol=1e-5, atol=1e-8, msg=key)


def test_an_old_run_is_not_continued_on_the_synthetic_tasks_new_version(tmp_path: Path) -> None:
    """Its command as it was typed then would go on with other examples (version 2): refused, the version
    named, the value to type given, and nothing changed but the refusal's line in its log."""
    stopped = copy_run(LEGACY / "run-stopped", tmp_path / "run")
    before = {path: path.read_bytes() for path in stopped.rglob("*") if path.is_file()}
    typed = [arg for arg in overrides(stopped) if arg != OLD_TASK]
    proc = run_app([*typed, f"hydra.run.dir={stopped}"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "data.synthetic_version: 1 -> 2" in proc.stderr
    assert "give the values it holds: data.synthetic_version=1;" in proc.stderr
    after = {path: path.read_bytes() for path in stopped.rglob("*") if path.is_file()}
    log = stopped / "train.log"
    assert after.pop(log).startswith(before.pop(log)) and after == before


def test_an_old_run_shortened_below_its_checkpoint_in_its_first_epoch_is_refused_with_its_folder_as_it_was(
        tmp_path: Path) -> None:
    """Its checkpoint (step 8, in its first epoch of 10 steps) is from before checkpoints kept an epoch's size, so the
    folder cannot count train.epochs=0.5's steps before the data loads: the loop refused them (5, fewer than the 8
    trained), but only after the refused command's config.yaml and overrides.yaml had become the folder's. Refused as
    the checkpoint is restored, nothing changed but the refusal's line in its log."""
    stopped = copy_run(LEGACY / "run-stopped", tmp_path / "run")
    before = {path: path.read_bytes() for path in stopped.rglob("*") if path.is_file()}
    proc = run_app([*overrides(stopped), f"hydra.run.dir={stopped}", "train.max_steps=null", "train.epochs=0.5",
                    "train.accept_changes=[train.max_steps,train.epochs]"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: this run already trained 8 steps, more than the 5 that train.max_steps or "
                                  "train.epochs now plan: a run cannot be shortened."), proc.stderr
    after = {path: path.read_bytes() for path in stopped.rglob("*") if path.is_file()}
    log = stopped / "train.log"
    assert after.pop(log).startswith(before.pop(log)) and after == before


def test_a_finished_old_run_answers_with_its_results_and_continues_with_accepted_changes(tmp_path: Path) -> None:
    finished = copy_run(LEGACY / "run-finished", tmp_path / "run")
    recorded = read_results(finished)
    args = [*overrides(finished), f"hydra.run.dir={finished}"]
    assert "this run already finished" in run(args, tmp_path)
    assert read_results(finished) == recorded
    run([*args, "train.max_steps=26", "train.accept_changes=[train.max_steps]"], tmp_path)
    continued = read_results(finished)
    assert continued["train_steps"] == 26 and recorded["train_steps"] == 20


def test_an_old_run_folder_evaluates_to_what_its_run_recorded(tmp_path: Path) -> None:
    finished = LEGACY / "run-finished"
    run(["eval.only=true", f"model.name_or_path={finished}", f"hydra.run.dir={tmp_path / 'eval'}"], tmp_path)
    scored, recorded = read_results(tmp_path / "eval"), read_results(finished)
    assert scored["accuracy"] == recorded["accuracy"] and scored["objective"] == recorded["objective"]


def test_an_old_sweep_reports_as_it_did_and_its_command_answers_from_its_folders(tmp_path: Path) -> None:
    sweep = copy_run(LEGACY / "sweep", tmp_path / "sweep")
    before = (sweep / "report.md").read_text()
    assert report.main([str(sweep)]) == 0
    after = (sweep / "report.md").read_text()
    assert without_folder(after) == without_folder(before)
    assert (sweep / "learning_curves.png").stat().st_size > 0
    args = [arg for arg in overrides(sweep / "0") if not arg.startswith("seed=")]
    log = run(["-m", *args, "seed=1,2", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert log.count("this run already finished") == 2
    for job in ("0", "1"):
        assert read_results(sweep / job) == read_results(LEGACY / "sweep" / job)
