"""``python -m nli.report submission DIR [DIR ...] [--out FILE]``: the zip GLUE's leaderboard takes, made
from runs' test predictions.

gluebenchmark.com takes one zip of eleven files: one per test set of GLUE's nine tasks (MNLI has two) and
``AX.tsv``, GLUE's diagnostic set, predicted by the MNLI model. A run with ``train.predict=true`` writes its
task's files under ``predictions/`` (nli.output.submission). Each DIR is a run folder or a sweep directory
(its newest sweep's completed jobs, read as the report reads them: nli.sweep.report.load_rows), local or in a
bucket. Of several runs of one task (a sweep over seeds or learning rates), the zip takes the files of the
run whose objective on the dev set is best: a choice made without the test set, as a leaderboard entry must
be; a task's files all come from that one run (MNLI-m, MNLI-mm and AX from one model).

The zip is written with what was found. The command lists each file with the run it came from and that
run's objective, and names what GLUE would not take: a file no run wrote, a task's chosen run that lacks one
of its files, a file with another number of predictions than GLUE's test set has, or without GLUE's header.
It then ends with status 1, so that a script does not submit an incomplete zip by mistake; an earlier zip of
all eleven files at ``--out`` is kept rather than replaced by such a one.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from nli.contract import PREDICTIONS_DIR
from nli.errors import UserError
from nli.io.storage import Storage, file_in_the_way, write_refusal
from nli.sweep import report

# Each file of a GLUE submission: the task whose run writes it, and the number of examples of GLUE's test set
# (GLUE's download and the Hub's nyu-mll/glue hold the same). conf/task's test_splits and diagnostic name them.
GLUE_FILES: Dict[str, Tuple[str, int]] = {
    "CoLA.tsv": ("cola", 1_063), "SST-2.tsv": ("sst2", 1_821), "MRPC.tsv": ("mrpc", 1_725),
    "STS-B.tsv": ("stsb", 1_379), "QQP.tsv": ("qqp", 390_965), "MNLI-m.tsv": ("mnli", 9_796),
    "MNLI-mm.tsv": ("mnli", 9_847), "QNLI.tsv": ("qnli", 5_463), "RTE.tsv": ("rte", 3_000), "WNLI.tsv": ("wnli", 146),
    "AX.tsv": ("mnli", 1_104),
}
COMMAND = "submission"  # python -m nli.report submission (nli/report.py)
HEADER = "index\tprediction"  # the first line of every file (nli.output.submission)
DEFAULT_OUT = Path("glue_submission.zip")


@dataclass(frozen=True)
class Run:
    """A completed run that wrote GLUE submission files."""

    folder: str  # its output folder, as the sweep's table or the command line names it
    objective: float  # on the dev set: what picks one run of a task
    files: Tuple[str, ...]  # the GLUE files in its predictions/


@dataclass(frozen=True)
class Chosen:
    """A task's run in the zip, and how many runs of the task there were to choose from."""

    task: str
    run: Run
    of: int


def runs(paths: Sequence[report.Source], notes: List[str]) -> List[Run]:
    """Every completed run of ``paths`` with a finite objective and GLUE files in its predictions/, each once: a
    sweep given with one of its jobs' folders (``sweep sweep/0``) lists that job twice, and a task's run was then
    'the best of 3 runs' of two."""
    found: Dict[str, Run] = {}
    for row in report.completed(report.load_rows(paths, notes)):
        objective, folder = float(row["objective"]), str(row.get("output_dir") or "")
        storage = Storage(folder, key="DIR")
        files = tuple(name for name in storage.list(PREDICTIONS_DIR) if name in GLUE_FILES)
        if files and not math.isnan(objective):
            found.setdefault(storage.absolute(), Run(folder, objective, files))
    return list(found.values())


def choose(candidates: Sequence[Run]) -> Dict[str, Chosen]:
    """Each task's run with the best objective (the first given, of equals)."""
    by_task: Dict[str, List[Run]] = {}
    for run in candidates:
        for task in dict.fromkeys(GLUE_FILES[name][0] for name in run.files):
            by_task.setdefault(task, []).append(run)
    return {task: Chosen(task, max(each, key=lambda run: run.objective), len(each)) for task, each in by_task.items()}


def problems(name: str, text: str) -> List[str]:
    """Why GLUE would not take ``text`` as its file ``name``: another header, or another number of predictions."""
    lines = text.splitlines()
    found = [] if lines[:1] == [HEADER] else [f"{name}: its first line is not GLUE's header ({HEADER!r})"]
    expected, predictions = GLUE_FILES[name][1], max(len(lines) - 1, 0)
    if predictions != expected:
        found.append(f"{name}: {predictions:,} predictions, where GLUE's test set has {expected:,} examples "
                     "(a run on a part of it, or on other data)")
    return found


def write_zip(chosen: Dict[str, Chosen], out: Path) -> Tuple[List[str], List[str], bool]:
    """The chosen runs' files into ``out`` (replaced whole: never half a zip); the lines that say where each
    came from, what GLUE would not take, and whether ``out`` was written: an earlier zip of GLUE's every file is
    not replaced by one GLUE would not take (a command given fewer runs than the last)."""
    files: Dict[str, str] = {}
    lines: List[str] = []
    wrong: List[str] = []
    for name, (task, _) in GLUE_FILES.items():  # read first: a run that cannot be read is not --out's fault
        pick = chosen.get(task)
        if pick is None or name not in pick.run.files:
            wrong.append(f"{name}: no run of {task} given wrote it (train.predict=true writes it)" if pick is
                         None else f"{name}: the chosen run of {task}, {pick.run.folder}, did not write it")
            continue
        raw = Storage(pick.run.folder, key="DIR").read_bytes(f"{PREDICTIONS_DIR}/{name}")
        try:
            files[name] = raw.decode("utf-8")
        except UnicodeDecodeError as err:  # not what the run wrote: changed since, by hand or by another program
            wrong.append(f"{name}: {pick.run.folder.rstrip('/')}/{PREDICTIONS_DIR}/{name} is not UTF-8 text (byte "
                         f"{err.start:,}): changed since the run wrote it; predict again (eval.only=true "
                         "train.predict=true)")
            continue
        wrong.extend(problems(name, files[name]))
        best = f" (the best of {pick.of} runs)" if pick.of > 1 else ""
        lines.append(f"  {name:<12} {pick.run.folder}  objective {pick.run.objective:.4f}{best}")
    if wrong and whole(out):
        return lines, wrong, False
    partial = out.with_name(f".{out.name}.{os.getpid()}")
    try:
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, text in files.items():
                archive.writestr(name, text)
        os.replace(partial, out)
    except OSError as err:  # a full disk, a folder it may not write: said of --out, not of the temporary file
        raise OSError(f"--out {out} could not be written: {write_refusal(err) or err.strerror or err}") from None
    finally:
        partial.unlink(missing_ok=True)
    return lines, wrong, True


def whole(path: Path) -> bool:
    """Whether ``path`` is a zip that holds each of GLUE's files."""
    try:
        with zipfile.ZipFile(path) as archive:
            return set(GLUE_FILES) <= set(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nli.report submission", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=report.source, metavar="DIR",
                        help="run folders and sweep directories whose runs wrote test predictions (local or gs://)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the zip to write (default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    notes: List[str] = []
    try:
        # Said before anything is read, and of the path given, not a temporary.
        if args.out.is_dir():
            raise UserError(f"--out {args.out} is a folder: give the zip's file name (e.g. {args.out / DEFAULT_OUT})")
        if args.out.is_file() and not zipfile.is_zipfile(args.out):  # a run's file named by mistake: kept
            raise UserError(f"--out {args.out} is a file that is not a zip: the submission replaces only an earlier "
                            f"zip; give a new name (e.g. {args.out.parent / DEFAULT_OUT})")
        if (blocker := file_in_the_way(args.out.parent)) is not None:
            raise UserError(f"--out {args.out}: {blocker} is a file, not a folder: give another path")
        if not args.out.parent.is_dir():
            raise UserError(f"--out {args.out}: the folder {args.out.parent} does not exist: make it, or give "
                            "another path")
        found = runs(args.paths, notes)
        if not found:
            raise UserError(f"no completed run of {', '.join(map(str, args.paths))} wrote GLUE test predictions: "
                            "train with train.predict=true, or evaluate a trained model with eval.only=true "
                            "train.predict=true")
        lines, wrong, written = write_zip(choose(found), args.out)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a folder that cannot be read, a zip that cannot be written: no traceback
        print(f"error: {err}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not written:
        print(f"{args.out} is kept: it holds GLUE's {len(GLUE_FILES)} files, and this zip of {len(lines)}, which GLUE "
              "would not take, would replace it. Give --out another name to write this one", file=sys.stderr)
    else:
        print(f"{args.out}: {len(lines)} of GLUE's {len(GLUE_FILES)} files\n" + "\n".join(lines))
    if wrong:
        print("GLUE would not take this zip as it is:\n" + "\n".join(f"  {line}" for line in wrong), file=sys.stderr)
        return 1
    return 0

