"""A run resumed on training or evaluation data that changed since its checkpoint."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest

from tests.runs.test_eval_folder import stop_at
from tests.runs.test_glue import mnli_dir
from tests.support.runs import GLUE_DATA, read_results, run_app, run_process

RUN = ["task=rte", "model=tiny", "data.max_seq_length=32", "data.max_eval_samples=16", "train.batch_size=16",
       "train.eval_every=2", "train.progress_bar=false", "hw=cpu"]


def run_of_100_examples(tmp_path: Path) -> Tuple[Path, List[str], Dict[str, str]]:
    """A run of the first 100 of RTE's training examples stopped at step 2 (32 examples into its epoch), read from
    ``tmp_path``'s train.tsv and dev.tsv: its folder, its arguments, and its files' digests (:func:`files_of`)."""
    (tmp_path / "train.tsv").write_text("".join((GLUE_DATA / "RTE" / "train.tsv").read_text(encoding="utf-8")
                                                .splitlines(keepends=True)[:101]), encoding="utf-8")
    shutil.copy(GLUE_DATA / "RTE" / "dev.tsv", tmp_path / "dev.tsv")
    run_dir = tmp_path / "run"
    args = [*RUN, f"+data.files.train={tmp_path / 'train.tsv'}", f"+data.files.validation={tmp_path / 'dev.tsv'}",
            f"hydra.run.dir={run_dir}"]
    first = run_app([*args, "train.max_steps=2"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    return run_dir, args, files_of(run_dir)


@pytest.mark.parametrize("lines_now", [21, 121], ids=["shrunk-below-its-place", "grown"])
def test_a_training_set_of_another_size_than_the_checkpoints_is_refused(tmp_path: Path, lines_now: int) -> None:
    """The checkpoint was 32 examples into an epoch of 100. A training file of 20 now: the epoch held no batch, and
    the resumed run waited on one for ever, spinning a core, deaf to SIGTERM's stop. Of 120: it went on without a
    word, its place, order and epochs counted in examples that are no longer the ones it trained on. Each is refused,
    naming both counts, with every file of the folder as it was."""
    run_dir, args, kept = run_of_100_examples(tmp_path)
    lines = (GLUE_DATA / "RTE" / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "train.tsv").write_text("".join(lines[:lines_now]), encoding="utf-8")
    resumed = run_process([*args, "train.max_steps=4", "train.accept_changes=[train.max_steps]"], cwd=tmp_path,
                          timeout=120)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert resumed.stderr.startswith(f"error: this run trained on 100 training examples an epoch, and its training "
                                     f"set now has {lines_now - 1}: the training data changed since its checkpoint "
                                     "of step 2"), resumed.stderr
    assert files_of(run_dir) == kept  # its config.yaml too: refused before this attempt's was recorded


def label_fixed(lines: List[str]) -> List[str]:
    """The first example's label corrected, its text as it was."""
    index, first, second, label = lines[1].rstrip("\n").split("\t")
    other = "not_entailment" if label == "entailment" else "entailment"
    return [lines[0], "\t".join([index, first, second, other]) + "\n", *lines[2:]]


def sentence_corrected(lines: List[str]) -> List[str]:
    """A word of the last example's hypothesis corrected, its label as it was."""
    index, first, second, label = lines[-1].rstrip("\n").split("\t")
    return [*lines[:-1], "\t".join([index, first, second + " Indeed.", label]) + "\n"]


def rows_shuffled(lines: List[str]) -> List[str]:
    """The same examples, last first."""
    return [lines[0], *reversed(lines[1:])]


def files_of(run_dir: Path) -> Dict[str, str]:
    """Each file a finished run keeps (its log aside, which an attempt adds to) -> its SHA-256."""
    return {str(path.relative_to(run_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(run_dir.rglob("*")) if path.is_file() and path.name != "train.log"}


@pytest.mark.parametrize("edit, changed", [
    (label_fixed, "their labels differ, their text does not"),
    (sentence_corrected, "their text differs, their labels do not"),
    (rows_shuffled, "their text and labels differ: other examples, or the same ones in another order"),
], ids=["label-fixed", "sentence-corrected", "rows-shuffled"])
def test_a_training_file_edited_at_the_same_size_is_refused(tmp_path: Path, edit: Callable[[List[str]], List[str]],
                                                            changed: str) -> None:
    """The checkpoint was 32 examples into an epoch of 100, and the training file was edited in place, keeping its
    100 examples: the run went on without a word, its place and order pointing at other examples (or the same with
    other labels), its results of two datasets under one folder's name. It is refused, naming what differs, with
    every file of the folder as it was."""
    run_dir, args, kept = run_of_100_examples(tmp_path)
    lines = (tmp_path / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    edited = edit(lines)
    assert len(edited) == len(lines) and edited != lines
    (tmp_path / "train.tsv").write_text("".join(edited), encoding="utf-8")
    resumed = run_app([*args, "train.max_steps=4", "train.accept_changes=[train.max_steps]"], cwd=tmp_path)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert resumed.stderr.startswith("error: this run trained on 100 training examples an epoch, and its training "
                                     f"set now has 100 that are not those ({changed}): the training data changed "
                                     "since its checkpoint of step 2"), resumed.stderr
    assert "Put the training data back as it was, or start the run afresh in another" in resumed.stderr
    assert files_of(run_dir) == kept


@pytest.mark.parametrize("how", ["touched", "copied-elsewhere"])
def test_the_same_training_file_touched_or_copied_elsewhere_resumes(tmp_path: Path, how: str) -> None:
    """What the training set's digest must not see: the same examples in a file written again (a new modification
    time) or read from a copy in another folder (the same relative data.files, from another working directory)."""
    first_dir, other_dir, run_dir = tmp_path / "first", tmp_path / "other", tmp_path / "run"
    first_dir.mkdir()
    lines = (GLUE_DATA / "RTE" / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)[:101]
    (first_dir / "train.tsv").write_text("".join(lines), encoding="utf-8")
    shutil.copy(GLUE_DATA / "RTE" / "dev.tsv", first_dir / "dev.tsv")
    args = [*RUN, "+data.files.train=train.tsv", "+data.files.validation=dev.tsv", f"hydra.run.dir={run_dir}"]
    first = run_app([*args, "train.max_steps=2"], cwd=first_dir)
    assert first.returncode == 0, first.stdout + first.stderr
    if how == "touched":
        later = (first_dir / "train.tsv").stat().st_mtime_ns + 10**9
        os.utime(first_dir / "train.tsv", ns=(later, later))
        cwd = first_dir
    else:
        shutil.copytree(first_dir, other_dir, copy_function=shutil.copy)  # new files, new times
        cwd = other_dir
    resumed = run_app([*args, "train.max_steps=4", "train.accept_changes=[train.max_steps]"], cwd=cwd)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "step 2 of 4" in resumed.stderr + resumed.stdout
    assert read_results(run_dir)["train_steps"] == 4


def validation_run(tmp_path: Path, dev_lines: int) -> Tuple[Path, List[str], List[str]]:
    """The arguments of a run of 100 training examples scored on the first ``dev_lines`` lines of RTE's dev file (its
    header among them), its folder, and those lines, which data.files.validation reads from ``tmp_path``."""
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    train.write_text("".join((GLUE_DATA / "RTE" / "train.tsv").read_text(encoding="utf-8")
                             .splitlines(keepends=True)[:101]), encoding="utf-8")
    lines = (GLUE_DATA / "RTE" / "dev.tsv").read_text(encoding="utf-8").splitlines(keepends=True)[:dev_lines]
    dev.write_text("".join(lines), encoding="utf-8")
    return tmp_path / "run", [*RUN, f"+data.files.train={train}", f"+data.files.validation={dev}"], lines


@pytest.mark.parametrize("edit, changed", [
    (label_fixed, "their labels differ, their text does not"),
    (sentence_corrected, "their text differs, their labels do not"),
    (rows_shuffled, "their text and labels differ: other examples, or the same ones in another order"),
], ids=["label-fixed", "sentence-corrected", "rows-shuffled"])
def test_a_validation_file_edited_at_the_same_size_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              edit: Callable[[List[str]], List[str]],
                                                              changed: str) -> None:
    """A run stopped by SIGTERM at step 3, its best so far step 2's score on the 16 validation examples it scores
    (data.max_eval_samples=16), and the validation file edited in place, keeping its 16 examples: the resumed run
    compared its new scores with that best, measured on the old examples, to pick the checkpoint to export, and
    scored that checkpoint at its end on the new ones. It is refused, naming what differs, with every file of the
    folder as it was; put back, the file resumes."""
    run_dir, args, lines = validation_run(tmp_path, 17)
    args = [*args, "train.max_steps=4"]
    stop_at(run_dir, args, 3, monkeypatch)
    kept = files_of(run_dir)
    edited = edit(lines)
    assert len(edited) == len(lines) and edited != lines
    (tmp_path / "dev.tsv").write_text("".join(edited), encoding="utf-8")
    resumed = run_app([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert resumed.stderr.startswith("error: this run was evaluated on validation examples up to its checkpoint of "
                                     f"step 3, and its validation split now holds others ({changed}): the evaluation "
                                     "data changed since"), resumed.stderr
    assert "Put the evaluation data back as it was, or start the run afresh in another" in resumed.stderr
    assert files_of(run_dir) == kept
    (tmp_path / "dev.tsv").write_text("".join(lines), encoding="utf-8")
    again = run_app([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert read_results(run_dir)["train_steps"] == 4


def test_a_finished_run_continued_on_an_edited_validation_file_is_refused(tmp_path: Path) -> None:
    """A finished run going on with more steps (train.accept_changes) judges them against its best of the steps
    before: on a validation file edited since, refused as a resume is, results.json and all as they were."""
    run_dir, args, lines = validation_run(tmp_path, 17)
    args = [*args, f"hydra.run.dir={run_dir}"]
    first = run_app([*args, "train.max_steps=2"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    kept = files_of(run_dir)
    (tmp_path / "dev.tsv").write_text("".join(label_fixed(lines)), encoding="utf-8")
    continued = run_app([*args, "train.max_steps=4", "train.accept_changes=[train.max_steps]"], cwd=tmp_path)
    assert continued.returncode == 1, continued.stdout + continued.stderr
    assert continued.stderr.startswith("error: this run was evaluated on validation examples up to its checkpoint "
                                       "of step 2, and its validation split now holds others (their labels differ, "
                                       "their text does not)"), continued.stderr
    assert files_of(run_dir) == kept


@pytest.mark.parametrize("how", ["touched", "copied-elsewhere", "edited-past-the-examples-scored"])
def test_the_same_validation_examples_touched_copied_or_edited_where_unscored_resume(tmp_path: Path, how: str) -> None:
    """What the validation set's digest must not see: the same examples in a file written again (a new modification
    time), read from a copy in another folder, or the file edited past the 16 examples data.max_eval_samples scores
    (which the run never scored, nor will)."""
    first_dir, other_dir, run_dir = tmp_path / "first", tmp_path / "other", tmp_path / "run"
    first_dir.mkdir()
    _, _, lines = validation_run(first_dir, 40)
    args = [*RUN, "+data.files.train=train.tsv", "+data.files.validation=dev.tsv", f"hydra.run.dir={run_dir}"]
    first = run_app([*args, "train.max_steps=2"], cwd=first_dir)
    assert first.returncode == 0, first.stdout + first.stderr
    cwd = first_dir
    if how == "touched":
        later = (first_dir / "dev.tsv").stat().st_mtime_ns + 10**9
        os.utime(first_dir / "dev.tsv", ns=(later, later))
    elif how == "copied-elsewhere":
        shutil.copytree(first_dir, other_dir, copy_function=shutil.copy)  # new files, new times
        cwd = other_dir
    else:
        (first_dir / "dev.tsv").write_text("".join(sentence_corrected(lines)), encoding="utf-8")
    resumed = run_app([*args, "train.max_steps=4", "train.accept_changes=[train.max_steps]"], cwd=cwd)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "step 2 of 4" in resumed.stderr + resumed.stdout
    assert read_results(run_dir)["train_steps"] == 4


def test_mnlis_matched_set_picks_the_best_and_is_checked_its_mismatched_set_only_reports(tmp_path: Path) -> None:
    """MNLI's validation_matched picks the best checkpoint (its accuracy is the objective), and validation_mismatched
    is scored beside it for the report, once more at the end on the file as it is then: the former edited, a
    continuation is refused, the split named; the latter edited, it continues."""
    glue = mnli_dir(tmp_path / "glue_data")
    matched, mismatched = glue / "MNLI" / "dev_matched.tsv", glue / "MNLI" / "dev_mismatched.tsv"
    run_dir = tmp_path / "run"
    args = ["task=mnli", f"data.dir={glue}", *RUN[1:], f"hydra.run.dir={run_dir}"]
    first = run_app([*args, "train.max_steps=2"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    kept, as_written = files_of(run_dir), matched.read_text(encoding="utf-8")
    matched.write_text("".join(rows_shuffled(as_written.splitlines(keepends=True))), encoding="utf-8")
    continuing = [*args, "train.max_steps=4", "train.accept_changes=[train.max_steps]"]
    refused = run_app(continuing, cwd=tmp_path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.startswith("error: this run was evaluated on validation_matched examples up to its "
                                     "checkpoint of step 2, and its validation_matched split now holds others"), \
        refused.stderr
    assert files_of(run_dir) == kept
    matched.write_text(as_written, encoding="utf-8")
    mismatched.write_text("".join(rows_shuffled(mismatched.read_text(encoding="utf-8").splitlines(keepends=True))),
                          encoding="utf-8")
    continued = run_app(continuing, cwd=tmp_path)
    assert continued.returncode == 0, continued.stdout + continued.stderr
    assert read_results(run_dir)["train_steps"] == 4
