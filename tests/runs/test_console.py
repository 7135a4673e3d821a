"""What a newcomer sees: --help opens with examples, an error is one line on stderr, a refused run leaves no
folder, the end of a run says where its files are, and progress bars only on a terminal."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Callable, Sequence

import pytest

from nli.config.command import check
from tests.support.runs import CONF, FAST, run_app

ShareRun = Callable[[str, Sequence[str]], Path]
MISSING_FILES = ["task=rte", "model=tiny", "+data.files.train=/no/train.csv", "+data.files.validation=/no/dev.csv"]


def test_help_opens_with_example_commands_that_compose(tmp_path: Path) -> None:
    proc = run_app(["--help"], cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("python train.py: fine-tune")
    examples = [line.split("#")[0].strip() for line in proc.stdout.split("== Configuration groups ==")[0].splitlines()
                if line.strip().startswith("python train.py ")]
    assert len(examples) >= 6 and any("-m" in each for each in examples) and any("--cfg" in each for each in examples)
    assert any("hydra/launcher=vertex" in each for each in examples) and any("eval.only" in each for each in examples)
    for example in examples:
        args = [arg for arg in shlex.split(example)[2:] if arg != "--cfg" and arg != "job"]
        if not any("<" in arg for arg in args):  # a placeholder (a run's folder) is the reader's to fill
            check(args, CONF, "train")  # composes, every key known; a SystemExit would name what is wrong


def test_a_refused_run_is_one_line_on_stderr_and_leaves_no_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_app([*MISSING_FILES, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr == "error: data.files: /no/train.csv does not exist\n"
    assert "does not exist" not in proc.stdout  # not a second time in the console's log
    assert not run_dir.exists()  # it held nothing but the refused attempt's log and record


def test_the_headline_command_refused_here_leaves_no_empty_folders(tmp_path: Path) -> None:
    """python train.py model=roberta-large hw=v100 on a machine without its GPU left an empty outputs/mnli/."""
    (tmp_path / "outputs" / "rte").mkdir(parents=True)  # another task's runs: kept
    proc = run_app(["model=roberta-large", "hw=v100"], cwd=tmp_path)
    assert proc.returncode == 1 and "error: hw asks for a CUDA GPU (V100), but torch sees none here" in proc.stderr
    assert sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*")) == ["outputs", "outputs/rte"]


def test_a_refusal_with_the_run_dir_where_the_command_runs_keeps_that_directory(tmp_path: Path) -> None:
    """hydra.run.dir=. : the refused attempt's files go, the directory the user is in stays."""
    here = tmp_path / "here"
    here.mkdir()
    proc = run_app([*MISSING_FILES, "hydra.run.dir=."], cwd=here)
    assert proc.returncode == 1 and proc.stderr == "error: data.files: /no/train.csv does not exist\n"
    assert here.is_dir() and list(here.iterdir()) == []


def test_a_refusal_in_a_folder_that_holds_a_run_keeps_it_and_logs_there(shared_run: ShareRun, tmp_path: Path) -> None:
    from tests.support.runs import copy_run

    folder = copy_run(shared_run("fast", FAST), tmp_path / "run")
    proc = run_app([*FAST, "seed=7", f"hydra.run.dir={folder}"], cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and proc.stderr.count("error") == 1
    assert (folder / "results.json").is_file() and "holds a finished run with other settings" in \
        (folder / "train.log").read_text()


def test_the_end_of_a_run_says_where_its_files_are(tmp_path: Path) -> None:
    proc = run_app([*FAST, f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # Its figures in a line a person reads (it was results.json's 1,500 characters of JSON, provenance and all).
    results = json.loads((tmp_path / "results.json").read_text())
    said = next(line for line in proc.stdout.splitlines() if "][nli.output.results][INFO] - results: " in line)
    assert said.split(" - ", 1)[1] == (f"results: objective={results['objective']:.4f}, accuracy="
                                       f"{results['accuracy']:.4f}, loss={results['loss']:.4f}, ece="
                                       f"{results['ece']:.4f}, brier={results['brier']:.4f}; 12 steps in "
                                       f"{results['train_seconds']:.1f} s, the best at step {results['best_step']} "
                                       "(every figure in results.json)")
    block = [line.strip().split("  ") for line in proc.stdout.split("The run's files:\n")[1].splitlines()[:5]]
    assert [(line[0], line[-1].strip()) for line in block] == [
        (name, str(tmp_path / file)) for name, file in (("results", "results.json"), ("model", "model"),
                                                        ("eval predictions", "eval_predictions"),
                                                        ("log", "train.log"), ("csv", "metrics.csv"))]


def test_no_progress_bar_where_the_output_is_not_a_terminal(tmp_path: Path) -> None:
    args = [arg for arg in FAST if arg != "train.progress_bar=false"]
    proc = run_app([*args, "train.progress_bar=true", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert proc.returncode == 0 and "it/s" not in proc.stderr + proc.stdout and "train:" not in proc.stderr
    assert "step 12: loss=" in proc.stdout  # the log's lines say it instead


def test_the_end_of_a_sweep_says_where_its_table_is_and_how_to_report_it(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = run_app(["-m", *FAST, "seed=1,2", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"table    {sweep / 'sweep_results.csv'}" in proc.stdout
    assert f"report   python -m nli.report {sweep}" in proc.stdout


def test_a_run_dir_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    """Hydra's own answer was two tracebacks. Root writes through a mode of 555: chattr +i stops it too."""
    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() != 0:
        locked.chmod(0o555)
    elif subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("root, and chattr +i is not allowed here: no folder can be made read-only for this test")
    try:
        proc = run_app([*FAST, f"hydra.run.dir={locked / 'run'}"], cwd=tmp_path)
    finally:
        subprocess.run(["chattr", "-i", str(locked)], capture_output=True)
        locked.chmod(0o755)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith(f"error: hydra.run.dir={locked / 'run'}: cannot write there (")


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_a_crash_is_in_the_runs_log_with_its_traceback(sweep: bool, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A defect's exception (not a user's error) was printed by Hydra on the console alone: the run's train.log
    ended at the last line before it, and a sweep's job folder never said how its run ended."""
    from nli import recipe

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a defect in the training code")

    monkeypatch.setattr(recipe, "run", crash)
    folder = tmp_path / ("sweep" if sweep else "run")
    proc = run_app([*(["-m"] if sweep else []), *FAST, f"hydra.{'sweep' if sweep else 'run'}.dir={folder}"],
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    logged = (folder / ("0" if sweep else "") / "train.log").read_text()
    assert "the run crashed:\nTraceback (most recent call last):" in logged
    assert logged.rstrip().endswith("RuntimeError: a defect in the training code"), logged[-500:]
    assert (proc.stdout + proc.stderr).count("RuntimeError: a defect in the training code") == 1  # Hydra's, as before
