"""What a folder says is what happened: a refused command changes nothing in it, its record of the command is
the run's own, and settings that cannot take effect are refused or said (in the log and results.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import pytest
import yaml

from nli.sweep import report
from tests.support.runs import FAST, copy_run, run_app

ShareRun = Callable[[str, Sequence[str]], Path]


def _files(folder: Path) -> Dict[str, bytes]:
    """Every file of a run folder but its log (a refused attempt's error is logged there)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "train.log"}


def test_a_refused_command_changes_nothing_in_the_folder(shared_run: ShareRun, tmp_path: Path) -> None:
    folder = copy_run(shared_run("fast", FAST), tmp_path / "run")
    before = _files(folder)
    assert yaml.safe_load((folder / "overrides.yaml").read_text()) == FAST  # the run's own record of its command
    assert not (folder / ".hydra").exists()  # Hydra's record, rewritten by any later start, is not written
    for refused in (["train.max_steps=20"], ["optimizer.lr=-1"], ["+optimizer.lrr=1"],
                    ["schedule.warmup_steps=50"]):
        proc = run_app([*FAST, *refused, f"hydra.run.dir={folder}"], cwd=tmp_path)
        assert proc.returncode == 1, proc.stdout
        assert _files(folder) == before, refused
    assert report._run_row(folder, num=0)["overrides"] == FAST  # the report's: the command that ran there


def test_the_report_reads_the_runs_own_record_of_its_command(shared_run: ShareRun, tmp_path: Path) -> None:
    folder = copy_run(shared_run("fast", FAST), tmp_path / "run")
    (folder / "overrides.yaml").write_text(yaml.safe_dump([*FAST, "seed=7"]))
    row = report._run_row(folder, num=0)
    assert row["overrides"] == [*FAST, "seed=7"] and row["seed"] == "7"


def test_the_report_names_each_run_by_the_task_and_model_it_resolved(shared_run: ShareRun) -> None:
    """A report of two run folders labelled them task=None, model=None: the overrides typed, not what ran."""
    from tests.runs.test_same_seed import BASES

    quickstart = report._run_row(shared_run("fast", FAST), num=0)
    rte = report._run_row(shared_run("same-seed-rte", BASES["rte"]), num=1)
    assert (quickstart["task"], rte["task"]) == ("synthetic", "rte")  # typed through experiment=, and as task=rte
    assert quickstart["model"] == rte["model"] == "roberta from scratch, 2 layers of 128"
    varying = report.sweep.varying([quickstart, rte])
    assert "task" in varying and "model" not in varying  # the same model, typed two ways


def test_warm_up_past_the_end_of_the_run_is_refused(tmp_path: Path) -> None:
    # Known from the command (train.max_steps): refused before Hydra makes the folder.
    proc = run_app([*FAST, "schedule.warmup_steps=100000", f"hydra.run.dir={tmp_path / 'a'}"], cwd=tmp_path)
    assert proc.returncode == 1 and "error: schedule.warmup_steps=100000 warms up for 100000 optimizer steps, and " \
        "the run has 12 (train.max_steps=12): the learning rate would still be rising" in proc.stderr
    assert not (tmp_path / "a").exists()
    # Known once the data is (train.epochs): refused before the first step.
    proc = run_app([*FAST, "train.max_steps=null", "train.epochs=1", "schedule.warmup_steps=10",
                    f"hydra.run.dir={tmp_path / 'b'}"], cwd=tmp_path)
    assert proc.returncode == 1 and "error: schedule.warmup_steps=10 warms up for 10 optimizer steps, and the " \
        "run has 10 (train.epochs=1.0 of 320 examples in batches of 32)" in proc.stderr
    assert "e.g. schedule.warmup_steps=1," in proc.stderr
    assert not (tmp_path / "b" / "checkpoints").exists()


@pytest.mark.parametrize("warmup,steps", [(["schedule.warmup_ratio=0.999"], 9), ([], 0),
                                          (["schedule.warmup_steps=0"], 0)], ids=["ratio-0.999", "default", "advised"])
def test_a_warm_up_given_as_a_fraction_always_fits_the_run(warmup: List[str], steps: int, tmp_path: Path) -> None:
    """The first smoke test many people type, train.max_steps=1, was refused with the default 6% warm-up, and so
    was the advice it gave (schedule.warmup_steps=1). A fraction now warms up short of the last step."""
    length = ["train.max_steps=null", "train.epochs=1"] if steps else ["train.max_steps=1", "train.eval_every=1"]
    proc = run_app([*FAST, *length, *warmup, f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"training: {10 if steps else 1} steps of 32 examples (32 x 1 accumulated), warming up for {steps}" \
        in proc.stdout
    if not warmup:  # the advice for warmup_steps=1 at one step names what runs
        refused = run_app([*FAST, *length, "schedule.warmup_steps=1"], cwd=tmp_path)
        assert refused.returncode == 1 and "e.g. schedule.warmup_steps=0," in refused.stderr


def test_patience_the_run_cannot_reach_is_said_in_the_log_and_results(tmp_path: Path) -> None:
    proc = run_app([*FAST, "train.early_stopping.patience=2", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = ("train.early_stopping.patience=2 ends a run after 2 evaluation(s) without a gain, and this run evaluates "
            "2 time(s) in its 12 steps: early stopping cannot end it")
    assert said in proc.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert sum(said in each for each in results["warnings"]) == 1 and list(results)[-1] == "status"


def test_patience_the_run_can_reach_says_nothing(tmp_path: Path) -> None:
    proc = run_app([*FAST, "train.early_stopping.patience=1", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert proc.returncode == 0 and "early stopping cannot end it" not in proc.stdout
    warned = json.loads((tmp_path / "results.json").read_text()).get("warnings", [])
    assert not [each for each in warned if "early stopping" in each]  # (its 12 steps predict one class: said too)


def test_an_evaluation_only_run_refuses_adapters_and_says_what_it_ignores(shared_run: ShareRun, tmp_path: Path
                                                                         ) -> None:
    model = shared_run("fast", FAST) / "model"
    evaluate = [*FAST, "eval.only=true", f"model.name_or_path={model}", "model.scratch=null"]
    proc = run_app([*evaluate, "model/peft=lora", f"hydra.run.dir={tmp_path / 'lora'}"], cwd=tmp_path)
    assert proc.returncode == 1 and "error: eval.only=true evaluates a trained model as it is, and model/peft=lora " \
        "adds new adapters to train: drop model/peft=lora" in proc.stderr
    proc = run_app([*evaluate, "optimizer.lr=1e-3", "schedule=cosine", "train.compile=true",
                    f"hydra.run.dir={tmp_path / 'e'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = ("eval.only=true trains nothing, so it ignores data.synthetic_train_size, train.max_steps, "
            "train.eval_every, train.log_every, optimizer.lr, schedule, train.compile (set on the command line)")
    assert said in proc.stdout
    assert json.loads((tmp_path / "e" / "results.json").read_text())["warnings"][0] == said
    # The model is read as it was saved: a new dropout or head of the command's is none of its.
    proc = run_app([*evaluate, "model.dropout=0.3", "model.classifier_dropout=0.2",
                    "model.ignore_mismatched_sizes=true", f"hydra.run.dir={tmp_path / 'model'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ("eval.only=true trains nothing, so it ignores data.synthetic_train_size, train.max_steps, "
            "train.eval_every, train.log_every, model.dropout, model.classifier_dropout, "
            "model.ignore_mismatched_sizes (set on the command line)") in proc.stdout
