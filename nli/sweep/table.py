"""A sweep's table, under every launcher: each job's row as the job ends, the whole table and the
seeds' means at the end, and an exit status that says whether every job succeeded.

One sweep at a time in a sweep directory: the sweep claims it as it starts (``.sweep_claim.json``,
nli.io.claim's claim of a folder) and holds it to its end, however it ends. A second sweep started into
it meanwhile is refused before any job runs, told whose it is; a sweep killed outright leaves a claim
that the next sweep takes over (its process gone, or its heartbeat stale).

Each sweep gets an id as it starts (``sweep``, with its start time ``sweep_started``), and every row
carries it. Rows go to ``<sweep dir>/sweep_results.jsonl``, which keeps every sweep's rows (a sweep
run again in the directory adds its own; within one sweep, a job folder's row replaces that job's
earlier one), and ``sweep_results.csv``, which is this sweep's table alone, as printed at the end
(a search's command that continued its study: the study's trials, every command's, each row saying its
``study``); jobs of this sweep that differ only in ``seed`` are summed up in ``sweep_summary.csv`` (n, mean and
sd), and every two settings that differ in one swept value are compared in ``sweep_differences.csv`` (the
difference of their objectives with its uncertainty, nli.sweep.differences). ``python -m nli.report``
reports a directory's newest sweep, with the earlier commands of its study (nli.sweep.report).

Hydra's own and submitit's launchers call :class:`SweepResults` (a Hydra callback, named in
conf/train.yaml) where each job runs, so a job on a Slurm node writes its own row, under a file
lock (the callback, id and all, travels to the node pickled with the launcher); the Vertex AI
launcher, whose jobs run in the cloud, writes theirs with :func:`record` as it collects them,
stamped with :func:`running_sweep`. The callback in the process that started the sweep claims the
directory and prints the table at the end.

Light on purpose (no torch): Hydra instantiates the callback before any job.
"""

from __future__ import annotations

import atexit
import csv
import io
import json
import logging
import math
import os
import secrets
import signal
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeGuard, TypeVar

from filelock import FileLock
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

import nli.sweep.names  # noqa: F401 - registers the resolver the searches' configs name
from nli import contract
from nli.contract import PREEMPTED, RESULTS_FILE
from nli.errors import JobFailed, StorageError, UserError
from nli.io.claim import Claim, Use
from nli.io.storage import Storage
from nli.runtime.signals import exit_now, hold_ctrl_c, started, take_held
from nli.sweep import cost, differences
from nli.sweep import local_gpus as gpus

log = logging.getLogger(__name__)

RESULTS_JSONL = "sweep_results.jsonl"
RESULTS_CSV = "sweep_results.csv"
SUMMARY_CSV = "sweep_summary.csv"
DIFFERENCES_CSV = "sweep_differences.csv"
_LOCK = ".sweep_results.lock"
CLAIM = Use("sweep", ".sweep_claim.json", "give this sweep another hydra.sweep.dir")
SWEEP_ID, SWEEP_STARTED = "sweep", "sweep_started"  # the columns that say which sweep a row belongs to
# The column that says which Optuna study a search's row is a trial of (nli.sweep.search.study_key): the sweeps of
# the commands that continued one study are one table of its trials (:func:`of_study`).
STUDY = "study"
PROVENANCE, COMMIT, DIRTY = "provenance", "commit", "dirty"  # a job's code: results.json's, the row's columns

COMPLETED, FAILED = JobStatus.COMPLETED.name, JobStatus.FAILED.name
_Row = TypeVar("_Row", bound=Mapping[str, Any])
PRUNED = "PRUNED"  # a search's trial that its pruner stopped while it trained (its results.json: status pruned)
SEED = "seed"
# Columns of a row that are not metrics: its place in the sweep, and counters a mean says nothing of.
_NOT_METRICS = frozenset({"job", "train_steps", "train_skipped_steps", "best_step", "stopped_early", "pruned_at",
                          "trainable_parameters", SWEEP_STARTED, "started", *cost.COLUMNS})
# What the printed table shows besides the swept values (the files have every column).
_SHOWN = ("objective", "train_examples_per_second", "train_seconds")


def override_columns(overrides: Sequence[str]) -> Dict[str, str]:
    """``optimizer.lr=1e-3`` -> ``{"optimizer.lr": "0.001"}``: the key and the value as Hydra parses them, the value
    written as Hydra writes a sweep's jobs' (``1e-3`` as ``0.001``, ``false`` as ``False``), so that a run folder's
    overrides, kept as typed, and a sweep job's of the same value are one setting."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return {override.key_or_group: _written(override)
            for override in OverridesParser.create().parse_overrides(list(overrides))}


def _written(override: Any) -> str:
    """An override's value as Hydra writes a sweep's job's; a sweep's own (``1,2``, ``range(3)``: in a file edited
    by hand) as typed, which Hydra writes no single value of."""
    if override.is_sweep_override():
        return (override.input_line or "").partition("=")[2]
    return str(override.get_value_element_as_str())


def job_row(*, num: int, state: str, overrides: Sequence[str], results: Optional[Mapping[str, Any]],
            output_dir: str, error: Optional[str] = None, **extra: Any) -> Dict[str, Any]:
    """One job's row: its number and state (PRUNED for a completed job whose run was pruned), each override, the
    run's results, where it wrote, and for a failed job its error."""
    if state == COMPLETED and (results or {}).get("status") == contract.PRUNED:
        state = PRUNED
    row: Dict[str, Any] = {"job": num, "state": state, "overrides": list(overrides), **override_columns(overrides)}
    row.update({key: value for key, value in (results or {}).items() if key not in row and key != PROVENANCE})
    row.update(code_columns((results or {}).get(PROVENANCE)))
    row.update(output_dir=output_dir, error=error, ended=time.time(), **extra)
    return row


def code_columns(provenance: Any) -> Dict[str, Any]:
    """The code a job ran, from its results' provenance (nli.runtime.provenance), as the row's ``commit`` and
    ``dirty`` columns; none where its results have no provenance. The rest of the provenance stays in
    the job's results.json: the table keeps one flat value per column."""
    if not isinstance(provenance, Mapping) or "commit" not in provenance:
        return {}
    return {COMMIT: provenance.get("commit"), DIRTY: provenance.get("dirty")}


def read_json(url: str) -> Optional[Dict[str, Any]]:
    """A JSON file (local or gs://); None when there is none."""
    folder, _, name = url.rpartition("/")
    return Storage(folder or ".").read_json(name)


# --------------------------------------------------------------------------------- the files


def record(sweep_dir: Path, row: Dict[str, Any]) -> None:
    """Adds the job's row to the directory's rows, in place of an earlier row of the same job in the same folder
    and sweep (a job recorded again: a requeued Slurm job), and writes the CSV of the row's sweep. Jobs of one
    sweep end at once in several processes (or nodes): the lock lets one write at a time."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(sweep_dir / _LOCK)):
        rows = read_rows(sweep_dir)
        # By job number too: two jobs given one output_dir are two rows (the second one refused there), not one.
        same = [i for i, old in enumerate(rows) if old.get("output_dir") == row["output_dir"]
                and old.get(SWEEP_ID) == row.get(SWEEP_ID) and old.get("job") == row.get("job")]
        if same:
            rows[same[0]] = row
        else:
            rows.append(row)
        replace(sweep_dir / RESULTS_JSONL, "".join(json.dumps(each) + "\n" for each in rows))
        # The row is kept: the table is made from the rows, and again at the sweep's end.
        write_table(sweep_dir / RESULTS_CSV, of_study(rows, row.get(SWEEP_ID)))


def read_rows(sweep_dir: Path, notes: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """The directory's rows. A last line cut short (a copy, or a disk, that stopped in the middle of it) is left
    out, said in ``notes`` (else logged): its job's folder keeps its results. A damaged line before it is
    refused, by its number."""
    path = sweep_dir / RESULTS_JSONL
    if not path.exists():
        return []
    return parse_rows(path.read_text(), str(path), notes)


def parse_rows(text: str, where: str, notes: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """The rows of a ``sweep_results.jsonl`` read from ``where`` (:func:`read_rows`)."""
    lines = text.splitlines()
    rows: List[Dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number < len(lines) or text.endswith("\n"):
                raise UserError(f"{where}, line {number}: not JSON ({err.msg}, column {err.colno}): mend or remove "
                                "that line (each line is one job's row)") from None
            cut = (f"{where}: its last line ({number}) is cut short and left out (that job's folder keeps its "
                   f"results); the {len(rows)} rows before it are read")
            if notes is None:
                log.warning("%s", cut)
            else:
                notes.append(cut)
    return rows


def of_sweep(rows: Iterable[Mapping[str, Any]], sweep_id: Optional[str]) -> List[Dict[str, Any]]:
    """The rows of one sweep (None: the rows written before rows said their sweep), by job number: jobs that run
    side by side (joblib, the local GPUs, Vertex AI) end, and write their rows, in any order."""
    return _by_job([dict(row) for row in rows if row.get(SWEEP_ID) == sweep_id])


def _by_job(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return sorted(rows, key=lambda row: (0, row["job"]) if isinstance(row.get("job"), int) else (1, 0))


def of_study(rows: Iterable[Mapping[str, Any]], sweep_id: Optional[str], study: Optional[str] = None
             ) -> List[Dict[str, Any]]:
    """The rows of one sweep and, where it is a command that continued a search's study (its rows' ``study``), those
    of the earlier commands of that study too: one table of the study's trials, whose best may be any command's. Each
    job once, by its newest row: a trial one command stopped and the next resumed is one job in one folder. A sweep
    of another study, or of no study (a list sweep, rows written before rows said their study), is not taken. A
    command of ``study`` that ran no trial (its grid ran out, or it was stopped before the first ended) has the
    study's rows alone."""
    rows = list(rows)
    ours = of_sweep(rows, sweep_id)
    studies = {row.get(STUDY) for row in ours} - {None} or ({study} if study else set())
    if not studies:
        return ours
    newest: Dict[Any, Dict[str, Any]] = {}
    for row in sorted((row for row in rows if row.get(STUDY) in studies), key=_written_when):
        newest[row.get("job")] = dict(row)  # a later command's row of the job replaces an earlier one's
    return _by_job(list(newest.values()))


def _written_when(row: Mapping[str, Any]) -> Tuple[float, float]:
    """When a row's sweep started, then when its job ended: the order in which a study's commands wrote its rows."""
    return (float(row[SWEEP_STARTED]) if is_number(row.get(SWEEP_STARTED)) else 0.0,
            float(row["ended"]) if is_number(row.get("ended")) else 0.0)


def newest_sweep(rows: Sequence[Mapping[str, Any]]) -> Tuple[List[Dict[str, Any]], List[Optional[str]]]:
    """The rows of the sweep that started last, and the ids of the older sweeps whose rows are left
    out (rows written before rows said their sweep count as the oldest, one sweep)."""
    started: Dict[Optional[str], float] = {}
    for row in rows:
        started.setdefault(row.get(SWEEP_ID), float(row.get(SWEEP_STARTED) or 0.0))
    if not started:
        return [], []
    newest = max(started, key=lambda sweep_id: started[sweep_id])
    return of_sweep(rows, newest), [sweep_id for sweep_id in started if sweep_id != newest]


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    stream = io.StringIO()
    writer = csv.DictWriter(stream, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
    writer.writeheader()
    writer.writerows({key: _csv_cell(key, value) for key, value in row.items()} for row in rows)
    return stream.getvalue()


def _csv_cell(key: str, value: Any) -> Any:
    """The overrides as typed, space-separated; a nested result (per_class, confusion_matrix) as JSON."""
    if key == "overrides" and isinstance(value, list):
        return " ".join(value)
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def replace_or_remove(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """``rows`` as CSV at ``path`` (:func:`replace`); no file where there are none, so that none is left stale."""
    if rows:
        replace(path, to_csv(rows))
    else:
        path.unlink(missing_ok=True)


def replace(path: Path, text: str) -> None:
    """Readers never see half a file: write beside it, then rename over it. A write that fails (a full disk) leaves
    the file as it was, and nothing beside it."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def write_table(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """A job's table as its row is kept (:func:`record`): ``rows`` as CSV at ``path``. One that cannot be written (a
    full disk, a quota, a read-only mount) is a warning, not the job's failure: the row is in sweep_results.jsonl, and
    the table is made from the rows again at the sweep's end (which ends the sweep 1 where it cannot be written
    either). The file it would have replaced is removed, where it can be, rather than left to pass for the sweep's."""
    try:
        replace(path, to_csv(rows))
    except OSError as err:
        try:
            path.unlink(missing_ok=True)
            kept = "removed rather than left out of date"
        except OSError:
            kept = "left as it was, out of date"
        log.warning("%s could not be written (%s), and is %s: every row is in %s, from which the sweep makes its "
                    "table again at its end (and python -m nli.report %s its report)", path, err.strerror or err, kept,
                    path.parent / RESULTS_JSONL, path.parent)


# ------------------------------------------------------------------------------ seeds as one


def seed_groups(rows: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Jobs that differ only in ``seed``, one row per group: the other overrides, n (completed jobs),
    the seeds, the failed jobs, and the mean and sample standard deviation of every metric. Empty
    when no job sets a seed."""
    if not any(SEED in swept(row) for row in rows):
        return []
    keys = [key for key in dict.fromkeys(key for row in rows for key in swept(row)) if key != SEED]
    groups: Dict[differences.Setting, List[Mapping[str, Any]]] = {}
    for row in rows:  # by the values the rows show: a run folder's task and model as it resolved them
        groups.setdefault(_setting(row, keys), []).append(row)
    return [_group_row({key: value for key, value in setting if value != "None"}, members)
            for setting, members in groups.items()]


def _setting(row: Mapping[str, Any], keys: Sequence[str]) -> differences.Setting:
    """The row's values of ``keys``, as (key, value) in their order: which setting of a sweep over seeds it is."""
    return tuple((key, str(row.get(key))) for key in keys)


def one_per_seed(members: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """A setting's completed jobs, one per seed: of two runs of a seed (a sweep run again, or given to a report with
    a folder of one of its jobs), the last given, in the means and in the differences alike."""
    last = {str(row.get(SEED)): row for row in members if row["state"] == COMPLETED}
    return [row for row in members if last.get(str(row.get(SEED))) is row]


def repeated_seeds(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """A line for each setting that has a seed in more than one completed job: which one counts."""
    keys = [key for key in varying(rows) if key != SEED]
    runs: Dict[Tuple[differences.Setting, str], List[Mapping[str, Any]]] = {}
    for row in rows:
        if row["state"] == COMPLETED and SEED in swept(row):
            runs.setdefault((_setting(row, keys), str(row.get(SEED))), []).append(row)
    return [f"{' '.join(f'{key}={value}' for key, value in setting) or 'the setting'} has seed {seed} in "
            f"{len(found)} completed jobs ({', '.join(str(row.get('output_dir')) for row in found)}): the means and "
            f"differences count it once, from the last, {found[-1].get('output_dir')}"
            for (setting, seed), found in runs.items() if len(found) > 1]


def _group_row(overrides: Dict[str, str], members: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    done = one_per_seed(members)
    group: Dict[str, Any] = {**overrides, "n": len(done), "seeds": " ".join(str(row.get(SEED, "")) for row in done),
                             "failed": len(failed(members))}
    if any(row["state"] == PRUNED for row in members):  # stopped part-way: in no mean
        group["pruned"] = sum(row["state"] == PRUNED for row in members)
    for metric in metric_columns(done):
        group[f"{metric}_mean"], group[f"{metric}_sd"] = mean_sd([row[metric] for row in done
                                                                   if is_number(row.get(metric))])
    return group


def mean_sd(values: Sequence[float]) -> Tuple[float, float]:
    """The mean of ``values`` and their sample standard deviation (NaN for fewer than two); both NaN for none, and
    where one is NaN or infinite (a correlation of constant predictions, a diverged run's loss): the seeds have no
    mean then, and Python's statistics would raise on it rather than say so."""
    if not values or not all(math.isfinite(value) for value in values):
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def _seeded(rows: Sequence[Mapping[str, Any]]) -> Dict[differences.Setting, List[Mapping[str, Any]]]:
    """Each setting's completed jobs that set a seed and have an objective (the setting: the other swept values as
    (key, value) in one order)."""
    keys = [key for key in varying(rows) if key != SEED]
    found: Dict[differences.Setting, List[Mapping[str, Any]]] = {}
    for row in rows:
        if row["state"] == COMPLETED and SEED in swept(row):
            found.setdefault(_setting(row, keys), []).append(row)
    scored = {setting: [row for row in one_per_seed(members) if is_number(row.get("objective"))
                        and not math.isnan(row["objective"])] for setting, members in found.items()}
    return {setting: members for setting, members in scored.items() if members}


# Swept values whose settings are scored on other examples, or by another metric: another task, other data, another
# part of it. Their objectives do not subtract (RTE's accuracy less WNLI's says nothing): no difference across them.
OTHER_EXAMPLES = ("task", "data.dir", "data.files", "data.max_eval_samples", "data.synthetic_eval_size",
                  "data.synthetic_version")
# results.json's task: the one a job resolved, whatever was typed (experiment= presets name theirs).
TASK = "task"


def setting_pairs(rows: Sequence[Mapping[str, Any]]) -> List[differences.Pair]:
    """Every two settings of a sweep over seeds that differ in one swept value, with the difference of their
    objectives (nli.sweep.differences); none without seeds, none across :data:`OTHER_EXAMPLES`, and none
    between settings whose jobs resolved other tasks (``experiment=`` presets of two tasks)."""
    seeded = _seeded(rows)
    tasks = {frozenset(setting): _tasks(members) for setting, members in seeded.items()}

    def across_tasks(pair: differences.Pair) -> bool:
        a, b = (tasks[frozenset({**dict(pair.fixed), pair.key: value}.items())] for value in (pair.a, pair.b))
        return bool(a and b and a != b)  # a row written before results.json named its task: not told

    return [pair for pair in differences.pairs({setting: _by_seed(members) for setting, members in seeded.items()})
            if not any(pair.key == key or pair.key.startswith(f"{key}.") for key in OTHER_EXAMPLES)
            and not across_tasks(pair)]


def _by_seed(members: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
    """A setting's objective on each of its seeds: what nli.sweep.differences compares."""
    return {str(swept(row)[SEED]): float(row["objective"]) for row in members}


def _tasks(members: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    return frozenset(str(row[TASK]) for row in members if row.get(TASK) is not None)


def failed(rows: Iterable[_Row]) -> List[_Row]:
    """The jobs that did not end as they should: neither completed nor pruned by their search."""
    return [row for row in rows if row["state"] not in (COMPLETED, PRUNED)]


def metric_columns(rows: Iterable[Mapping[str, Any]]) -> List[str]:
    """The numeric columns of the rows' results, objective first."""
    rows = list(rows)
    overridden = {key for row in rows for key in swept(row)}
    columns = [key for row in rows for key, value in row.items()
               if is_number(value) and key not in overridden and key not in _NOT_METRICS and key != "ended"]
    return sorted(dict.fromkeys(columns), key=lambda key: key != "objective")


# Where a job wrote is no setting of it: two folders of one config hold the same run, and the row's output_dir column
# is the folder itself (output_dir=runs/s${seed} made each seed a setting of its own, n=1).
_NOT_SETTINGS = frozenset({"output_dir"})


def swept(row: Mapping[str, Any]) -> Dict[str, str]:
    """The row's overrides as key -> value, but for where the job wrote."""
    return {key: value for key, value in override_columns(row.get("overrides") or []).items()
            if key not in _NOT_SETTINGS}


def is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ----------------------------------------------------------------------------- the callback


class SweepResults(Callback):
    """Where the sweep started: the directory claimed for this sweep, and at the end the table, the
    seeds' summary and the failed jobs of this sweep. Where each job runs: the job's row, stamped with
    the sweep's id. A sweep with a failed job exits non-zero after every other job has run."""

    def __init__(self) -> None:
        self.sweep_dir: Optional[Path] = None
        self.sweep_id: Optional[str] = None  # plain values only: the callback travels pickled to the jobs
        self.started = 0.0
        self.wandb: Optional[DictConfig] = None  # the sweep's W&B logger, if it has one
        self.study: Optional[str] = None  # the study a search's sweep runs trials of (join_study)
        self.job: Dict[str, Any] = {}  # where a job runs: when it started, and the GPUs nli.sweep.local_gpus gave it
        self.unrecorded: List[Dict[str, Any]] = []  # the rows of jobs that ran here and could not be recorded

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if (refused := gpus.refusal(config)) is not None:  # hydra/launcher=local-gpus that cannot run as asked
            raise SystemExit(f"error: {refused}")
        # Before the sweeper, which writes multirun.yaml (and an Optuna study's file) into the directory.
        self.sweep_id = hold(sweep_dir, jobs_here=_jobs_run_here(config))
        self.sweep_dir, self.started = sweep_dir, _HELD[self.sweep_id].started
        self.wandb = OmegaConf.select(config, "logger.wandb")
        # Hydra's sweepers raise the first failed job's error once its batch has run, and on_multirun_end
        # is then not called: the table comes as the entry point returns (nli.cli.entry: finish_open),
        # after Hydra has printed that error; at exit, where another entry point started the sweep.
        _OPEN.append(self)
        atexit.register(self._finish)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Before the task function, so before anything in the job touches CUDA: under
        hydra/launcher=local-gpus, the job's GPUs (nli.sweep.local_gpus)."""
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        if take_held() is not None:  # a Ctrl-C held since the last job (hold): the sweep stops before this one
            raise KeyboardInterrupt
        self.job = {"started": time.time()}
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if (held := gpus.lease(sweep_dir, OmegaConf.select(config, "hw.gpus_per_node", default=0),
                                  worker=not running_sweep(sweep_dir))) is not None:
            self.job["gpus"] = held.visible  # as CUDA_VISIBLE_DEVICES names them

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:  # a single run, or a Vertex AI job (its launcher writes the row)
            return
        job, self.job = self.job, {}
        job.update(cost.job_columns(config, job.get("started"), time.time()))  # its GPU-hours, where it has GPUs
        sweep_dir, row = Path(str(config.hydra.sweep.dir)), hydra_job_row(config, job_return, {**self.stamp(), **job})
        try:
            record(sweep_dir, row)
        except Exception as err:  # Hydra would make it a warning, and the table would lack the job without a word
            log.error("job #%s's row could not be added to %s (%s: %s), so the sweep's table will lack it; add this "
                      "line to that file, then python -m nli.report %s makes the report with it:\n%s", row["job"],
                      sweep_dir / RESULTS_JSONL, type(err).__name__, err, sweep_dir, json.dumps(row))
            self.unrecorded.append(row)  # the sweep ends non-zero where it ran in the sweep's process
        if _failed_in_a_list_sweep(config, job_return):
            # Hydra's basic sweeper raises a failed job's error once the job's batch has run: a user's error printed
            # under "Error executing job with overrides" and its HYDRA_FULL_ERROR advice (a stack trace of nothing),
            # the error the closing list gives in its line; and a batch after it never ran. Its row says FAILED; a
            # crash's traceback is printed now; the sweeper is told the job returned NaN, and the sweep ends
            # non-zero from its table (on_multirun_end).
            _show_crash(row, job_return._return_value)
            job_return.status, job_return.return_value = JobStatus.COMPLETED, math.nan

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = self.sweep_dir
        try:
            failed = self._finish()
        except Exception as err:  # Hydra makes a callback's error a warning: the sweep would end 0, its table unmade
            log.error("the sweep's table could not be made (%s: %s); its rows are in %s, and python -m "
                      "nli.report %s makes its report from them", type(err).__name__, err,
                      sweep_dir and sweep_dir / RESULTS_JSONL, sweep_dir, exc_info=not isinstance(err, OSError))
            raise SystemExit(1) from err
        if failed:  # a sweeper that let the sweep go on past them (Optuna's max_failure_rate)
            assert sweep_dir is not None  # a sweep with no folder has no table, and so no failed rows (_finish)
            # The closing list is on stdout with the table; stderr, where a single run's error goes, says it too.
            lost = len(self.unrecorded)
            said = [f"{len(failed) - lost} of the sweep's jobs failed"] if len(failed) > lost else []
            said += [f"{lost} job(s) are missing from its table"] if lost else []
            raise SystemExit(f"error: {' and '.join(said)}: the lines above say which and why "
                             f"({sweep_dir / RESULTS_CSV})")

    def stamp(self) -> Dict[str, Any]:
        """The columns that tie a row to this sweep, and to its study where it is a search's (:func:`join_study`)."""
        return {SWEEP_ID: self.sweep_id, SWEEP_STARTED: self.started, **({STUDY: self.study} if self.study else {})}

    def _finish(self) -> List[Dict[str, Any]]:
        """Prints the table once, and lets the directory go; the jobs of this sweep that failed."""
        if self in _OPEN:
            _OPEN.remove(self)
        if self.sweep_dir is None:
            return []
        sweep_dir, self.sweep_dir = self.sweep_dir, None
        try:
            ended_badly = self._report(sweep_dir)
        finally:
            release(self.sweep_id)
        if self.unrecorded:
            jobs = ", ".join(f"#{row['job']}" for row in self.unrecorded)
            log.error("%d job(s) ran but their rows could not be recorded, so the table lacks them (each row is in "
                      "the log above): %s", len(self.unrecorded), jobs)
        return [*ended_badly, *self.unrecorded]

    def _report(self, sweep_dir: Path) -> List[Dict[str, Any]]:
        # A search's command: its study's trials, every command's (the best may be an earlier one's).
        rows = of_study(read_rows(sweep_dir), self.sweep_id, self.study)
        if not rows:
            return []
        replace(sweep_dir / RESULTS_CSV, to_csv(rows))
        groups = seed_groups(rows)
        pairs = setting_pairs(rows)
        # An earlier sweep's summary or differences would pass for this one's: each is this sweep's, or none.
        replace_or_remove(sweep_dir / SUMMARY_CSV, groups)
        replace_or_remove(sweep_dir / DIFFERENCES_CSV, differences.records(pairs))
        log.info("Sweep results (%s):\n%s", sweep_dir / RESULTS_CSV, format_rows(rows))
        if (used := cost.summary(rows)) is not None:
            log.info("%s", used)
        if groups:
            log.info("Over seeds (%s):\n%s", sweep_dir / SUMMARY_CSV, format_groups(groups))
        if pairs:
            log.info("Differences between settings (%s):\n%s\n%s", sweep_dir / DIFFERENCES_CSV, format_pairs(pairs),
                     differences.EXPLAINED)
        # This command's alone: an earlier command of the study said its own, and ended non-zero for them.
        ended_badly = [row for row in failed(rows) if row.get(SWEEP_ID) == self.sweep_id]
        if self.wandb is not None:
            to_wandb(self.wandb, sweep_dir, rows, groups)
        if ended_badly:
            lines = "\n".join(f"  #{row['job']} {' '.join(row['overrides'])}: {row.get('error') or row['state']}"
                              for row in ended_badly)
            # "The others ran" only where there are others: a sweep whose every job failed has none.
            ran = " (the others ran)" if len(ended_badly) < len(rows) else ""
            log.error("%d of the sweep's jobs failed%s:\n%s", len(ended_badly), ran, lines)
        log.info("The sweep's files:\n  table    %s\n  jobs     %s\n"
                 "  report   python -m nli.report %s   (report.md and the learning curves)",
                 sweep_dir / RESULTS_CSV, _job_folders(rows), sweep_dir)
        return ended_badly


# What a job's folder holds that the closing list names, in this order (a failed job's, its train.log alone).
JOB_FILES = (RESULTS_FILE, f"{contract.MODEL_DIR}/", f"{contract.EVAL_PREDICTIONS_DIR}/", "train.log")


def _job_folders(rows: Sequence[Dict[str, Any]]) -> str:
    """Where the jobs wrote, as the table's output_dir column has it (a search's trial=<n>, a Vertex AI job's
    folder in the bucket): the first that a job made, one with results where any has them, and what it holds. A
    trial the search refused was never launched, and its row names a folder that does not exist."""
    folders = [str(row.get("output_dir") or "") for row in rows]
    made = [folder for folder in folders if "://" in folder or (folder and Path(folder).is_dir())]
    if not made:
        return "the table's output_dir column" if not any(folders) else "none: no job made its folder"
    first = next((folder for folder in made if "://" not in folder and (Path(folder) / RESULTS_FILE).is_file()),
                 made[0])
    held = [name for name in JOB_FILES if "://" not in first and (Path(first) / name).exists()]
    files = f" ({', '.join(held)})" if held else ""
    return f"{first}{files}, and each job's in the table's output_dir column" if len(rows) > 1 else f"{first}{files}"


def report(sweep_dir: Path, sweep_id: Optional[str]) -> List[Dict[str, Any]]:
    """The end of a sweep whose jobs ended after its process did (``python -m nli.cloud attach``): its table,
    seeds' summary and failed jobs, printed and written as its callback would have; the failed jobs."""
    callback = SweepResults()
    callback.sweep_id = sweep_id
    return callback._report(sweep_dir)


_OPEN: List[SweepResults] = []  # the sweeps of this process whose table is still to be printed


def finish_open() -> None:
    """The table of every sweep this process started and has not ended, printed: the entry point calls it
    as Hydra returns, or exits after a failed job (nli.cli.entry)."""
    for callback in list(_OPEN):
        callback._finish()
    for sweep_id in list(_HELD):  # a sweep stopped (Ctrl-C) before its callback could list it above
        release(sweep_id)


# ------------------------------------------------------------------------ the sweep's directory


@dataclass
class _Held:
    """A sweep directory this process holds: its claim, and what SIGTERM and SIGINT did before the sweep."""

    directory: Path
    started: float
    claim: Claim
    sigterm: Any = None  # the handler the sweep replaced; None: it replaced none
    sigint: Any = None  # likewise, where the sweep holds Ctrl-C (its jobs run in this process)
    made: Optional[Path] = None  # the outermost folder the sweep made for its directory (None: it was there)
    study: Optional[str] = None  # the study whose trials the sweep runs, where it is a search's (join_study)
    # The claims the sweep holds besides its folder's (a search's of its study, join_study), let go with it: SIGTERM
    # ends the sweep at once (_stop_at_once), past the code that would let them go.
    also: List[Claim] = field(default_factory=list)


_HELD: Dict[str, _Held] = {}  # sweep id -> the directory this process holds for it
# A SIGTERM that came while the claim was being taken: its file may exist before _HELD knows it, so the
# stop waits until it does (hold), or the claim would be left behind.
_TAKING: List[bool] = []
_DEFERRED: List[int] = []


def hold(sweep_dir: Path, *, jobs_here: bool = False) -> str:
    """Claims ``sweep_dir`` for a new sweep of this process (nli.io.claim); its id. A directory a live
    sweep holds ends this one here, before any job, with one line: whose it is and what to do. Until
    :func:`release`, SIGTERM (where nothing else handles it) ends the sweep as an exit, which lets the
    directory go, rather than killing the process outright. Where the sweep's jobs run in this process
    (``jobs_here``: Hydra's basic launcher), a Ctrl-C between them is held (nli.runtime.signals.hold_ctrl_c)
    until the next job starts, which raises it, or its run, which stops as it starts; elsewhere it is the
    launcher's KeyboardInterrupt, with which each cancels its jobs."""
    # The handlers first: from the moment the claim exists, SIGTERM lets it go.
    started()  # the command's start-up handler gives way (nli.runtime.signals)
    sigterm = sigint = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        sigterm = signal.signal(signal.SIGTERM, _stop_at_once)
    if jobs_here and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        sigint = hold_ctrl_c(lambda: _stop_at_once(signal.SIGINT, None))
    now = time.time()
    sweep_id = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{secrets.token_hex(3)}"
    made = next((each for each in reversed([sweep_dir, *sweep_dir.parents]) if not each.exists()), None)
    try:
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StorageError(f"hydra.sweep.dir={sweep_dir} cannot be made: {err.strerror or err}") from None
        _TAKING.append(True)
        try:  # known to _HELD as it is made: a Ctrl-C from here on finds it (finish_open)
            claim = Claim.take(Storage(str(sweep_dir), key="hydra.sweep.dir"), use=CLAIM)
            # The sweep started as its claim did: a report made while it runs knows its rows by that (nli.sweep.report).
            _HELD[sweep_id] = _Held(sweep_dir.absolute(), claim.owner.started, claim, sigterm, sigint,
                                   made.absolute() if made else None)
        finally:
            _TAKING.clear()
    except UserError as refused:  # claimed by a live sweep, or not a directory this sweep can write
        _DEFERRED.clear()  # the refusal ends the sweep as it is
        _give_back(sigterm, sigint)
        raise SystemExit(f"error: {refused}") from None
    if _DEFERRED:
        _stop_at_once(_DEFERRED.pop(), None)
    return sweep_id


def release(sweep_id: Optional[str]) -> None:
    """Lets go of the sweep's directory (never raises), and gives SIGTERM back what it did before."""
    held = _HELD.pop(sweep_id or "", None)
    if held is None:
        return
    for claim in held.also:
        claim.release()
    held.claim.release()
    _give_back(held.sigterm, held.sigint)
    if held.made is not None:
        _remove_if_empty(held.directory, held.made)


def _remove_if_empty(directory: Path, made: Path) -> None:
    """The folders the sweep made, from its directory up to ``made``, removed while empty: a sweep refused
    before its first job (a search with nothing to search, a launcher's setting) leaves no empty folder that
    looks like a sweep's."""
    for each in [directory, *directory.parents]:
        try:
            each.rmdir()  # only an empty folder: a job's or the sweep's files keep it
        except OSError:
            return
        if each == made:
            return


def _give_back(sigterm: Any, sigint: Any) -> None:
    """SIGTERM's and SIGINT's handlers as they were before the sweep set its own (None: it set none)."""
    if threading.current_thread() is threading.main_thread():
        for each, handler in ((signal.SIGTERM, sigterm), (signal.SIGINT, sigint)):
            if handler is not None:
                signal.signal(each, handler)


def _jobs_run_here(config: DictConfig) -> bool:
    """Whether the sweep's launcher runs its jobs in this process, one after another (Hydra's basic launcher)."""
    from hydra.utils import get_class

    from nli.sweep.slots import BASIC

    target = OmegaConf.select(config, "hydra.launcher._target_")
    try:
        launcher = get_class(str(target))
    except Exception:  # Hydra names a launcher it cannot import as it instantiates it: not this check's to say
        return False
    return BASIC in {f"{each.__module__}.{each.__qualname__}" for each in launcher.__mro__}


def running_sweep(sweep_dir: Path) -> Dict[str, Any]:
    """The columns that tie a row to the sweep this process runs in ``sweep_dir`` (for a launcher that
    records its jobs' rows itself); none where it runs none there."""
    for sweep_id, held in _HELD.items():
        if held.directory == sweep_dir.absolute():
            return {SWEEP_ID: sweep_id, SWEEP_STARTED: held.started, **({STUDY: held.study} if held.study else {})}
    return {}


def join_study(sweep_dir: Path, study: str, claim: Optional[Claim] = None) -> None:
    """Marks the rows of the sweep this process runs in ``sweep_dir`` as trials of ``study`` (their ``study``
    column): the search calls it before its first trial, so that the table and the report take the rows of the
    commands that continued the study together (:func:`of_study`). Set on the sweep's callback too, which travels
    pickled to where each job runs (a Slurm node) and stamps its row there. The search's ``claim`` of its study is
    let go as the sweep's directory is, however the sweep ends."""
    for sweep_id, held in _HELD.items():
        if held.directory == sweep_dir.absolute():
            held.study = study
            held.also += [claim] if claim is not None else []
            for callback in _OPEN:
                if callback.sweep_id == sweep_id:
                    callback.study = study


def _stop_at_once(signum: int, frame: Optional[FrameType]) -> None:
    """SIGTERM where no job of this process handles it (between jobs, or while a launcher waits for
    jobs elsewhere), or a second Ctrl-C while the first is held (hold): the sweep ends at once, its
    directory let go. It exits here rather than raising: an exception raised wherever the signal lands
    can be caught and dropped there (a library's import wraps it in a RuntimeError), and the sweep would
    go on."""
    if _TAKING:
        _DEFERRED.append(signum)
        return
    message = (f"the sweep was stopped by {signal.Signals(signum).name}: the jobs that ended have their rows in "
               f"{RESULTS_JSONL}; jobs a launcher started elsewhere (Slurm, Vertex AI) may still run. Run the same "
               "command again to continue")
    log.warning("%s", message)
    print(message, file=sys.stderr)
    _tables_so_far()
    for sweep_id in list(_HELD):
        release(sweep_id)
    for handler in logging.getLogger().handlers:
        handler.flush()
    exit_now(PREEMPTED)


def _tables_so_far() -> None:
    """The table of each sweep this process runs, of the jobs that ended, as the sweep stops at once (its end's own
    table, files and W&B run are never made): printed alone, its rows already kept as each job ended."""
    for callback in list(_OPEN):
        if callback.sweep_dir is None:
            continue
        try:
            rows = of_study(read_rows(callback.sweep_dir), callback.sweep_id, callback.study)
        except Exception as err:  # a damaged table is the report's to name; the sweep stops all the same
            log.warning("the sweep's table so far could not be read (%s)", err)
            continue
        if rows:
            log.info("Sweep results so far (%s):\n%s", callback.sweep_dir / RESULTS_CSV, format_rows(rows))


def to_wandb(logger: DictConfig, sweep_dir: Path, rows: Sequence[Mapping[str, Any]],
             groups: Sequence[Mapping[str, Any]]) -> None:
    """The tables as a run of the sweep's W&B group (named like the jobs' group, job type
    ``sweep-summary``) and as an artifact of its files. W&B failing here costs the table nothing: the
    files are written."""
    import wandb

    from nli.tracking.loggers import wandb_choices

    group = sweep_dir.name  # as the jobs' group (nli.recipe)
    try:
        run = wandb.init(**wandb_choices(logger.mode, logger.project, logger.entity), group=group,
                         job_type="sweep-summary", name=f"{group}-summary", dir=str(sweep_dir),
                         tags=list(logger.tags or []))
        run.log({"sweep_results": _wandb_table(rows), **({"sweep_summary": _wandb_table(groups)} if groups else {})})
        artifact = wandb.Artifact(f"{group}-results", type="sweep-results")
        for name in (RESULTS_CSV, RESULTS_JSONL, SUMMARY_CSV, DIFFERENCES_CSV):
            if (sweep_dir / name).exists():
                artifact.add_file(str(sweep_dir / name))
        run.log_artifact(artifact)
        run.finish()
    except Exception as error:  # wandb's own errors are of many kinds; none must end the sweep's report
        log.warning("the sweep's tables were not logged to W&B (%s: %s); they are in %s",
                    type(error).__name__, error, sweep_dir)


def _wandb_table(rows: Sequence[Mapping[str, Any]]) -> Any:
    import wandb

    columns: List[str | int] = list(dict.fromkeys(key for row in rows for key in row))
    return wandb.Table(columns=columns, data=[[_plain(row.get(str(key))) for key in columns] for row in rows])


def _plain(value: Any) -> Any:
    """A cell W&B's table takes: lists as their text."""
    return " ".join(map(str, value)) if isinstance(value, list) else value


BASIC_SWEEPER = f"{BasicSweeper.__module__}.{BasicSweeper.__qualname__}"


def _failed_in_a_list_sweep(config: DictConfig, job_return: JobReturn) -> bool:
    """Whether ``job_return`` is a failed job of Hydra's basic sweeper: a user's error (JobFailed: one line, which
    the sweep's closing list gives in full) or a crash (:func:`_show_crash`)."""
    return job_return.status is JobStatus.FAILED and OmegaConf.select(config, "hydra.sweeper._target_") == BASIC_SWEEPER


def _show_crash(row: Mapping[str, Any], error: BaseException) -> None:
    """A crashed job's traceback on stderr, where Hydra printed it (its train.log ends with it too: nli.cli); a
    user's error is the closing list's line alone."""
    if not isinstance(error, JobFailed):
        shown = "".join(traceback.format_exception(error)).rstrip()
        print(f"job #{row['job']} {' '.join(row['overrides'])} crashed:\n{shown}", file=sys.stderr, flush=True)


def hydra_job_row(config: DictConfig, job_return: JobReturn, stamp: Mapping[str, Any]) -> Dict[str, Any]:
    """The row of a job run by one of Hydra's launchers, from its return and its results.json; a failed
    job's row holds no results (its folder's results.json, if any, is another run's)."""
    output_dir = str(OmegaConf.select(config, "output_dir") or config.hydra.runtime.output_dir)
    # A relative output_dir is relative to where the job ran (hydra.job.chdir=false): named whole, so that a report
    # made from anywhere else finds the job's folder.
    output_dir = output_dir if "://" in output_dir else os.path.abspath(output_dir)
    overrides = list(config.hydra.overrides.task)
    if job_return.status is JobStatus.COMPLETED:
        results = own_results(read_json(f"{output_dir.rstrip('/')}/{RESULTS_FILE}"), job_return.return_value,
                              output_dir)
        return job_row(num=int(config.hydra.job.num), state=COMPLETED, overrides=overrides, results=results,
                       output_dir=output_dir, **stamp)
    error = job_return._return_value  # the exception; .return_value would raise it
    return job_row(num=int(config.hydra.job.num), state=job_return.status.name, overrides=overrides, results=None,
                   output_dir=output_dir, error=str(error) or type(error).__name__, **stamp)


def own_results(results: Optional[Dict[str, Any]], returned: Any, output_dir: str) -> Optional[Dict[str, Any]]:
    """The results.json of the job that returned ``returned``: the job's own objective alone where the
    file says another (another run wrote the folder since) or there is none (an app that writes none)."""
    if not is_number(returned):
        return results
    if results is not None and _same(results.get("objective"), returned):
        return results
    if results is not None:
        log.warning("%s/%s holds objective %s, not this job's %s: another run wrote there since; the job's "
                    "row has its objective alone", output_dir.rstrip("/"), RESULTS_FILE, results.get("objective"),
                    returned)
    return {"objective": returned}


def _same(value: Any, returned: float) -> bool:
    return is_number(value) and (float(value) == float(returned) or math.isnan(value) and math.isnan(returned))


# -------------------------------------------------------------------------------- the tables


def format_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """The jobs: number, state, what varies between them, the headline figures, the error."""
    keys = varying(rows) or list(dict.fromkeys(key for row in rows for key in swept(row)))[:1]
    columns = ["job", "state", *keys, *[c for c in _SHOWN if any(c in row for row in rows)]]
    if any(row.get("error") for row in rows):
        columns.append("error")
    return format_table(rows, columns)


def format_groups(groups: Sequence[Mapping[str, Any]]) -> str:
    varying = [key for key in _varying_keys(groups) if key not in {"n", "seeds", "failed", "pruned"}]
    # Every group's metrics: a group whose jobs all failed has none, and it may come first.
    metrics = list(dict.fromkeys(key[:-5] for group in groups for key in group if key.endswith("_mean")))
    shown = [metric for metric in metrics if metric in _SHOWN] or metrics[:3]
    pruned = ["pruned"] if any("pruned" in group for group in groups) else []
    cells = [{**{key: group.get(key) for key in varying}, "n": group["n"], "failed": group["failed"],
              **{key: group.get(key, 0) for key in pruned},
              **{metric: _plus_minus(group.get(f"{metric}_mean"), group.get(f"{metric}_sd")) for metric in shown}}
             for group in groups]
    return format_table(cells, [*varying, "n", "failed", *pruned, *shown])


def format_pairs(pairs: Sequence[differences.Pair]) -> str:
    return format_table([dict(zip(differences.HEADER, differences.cells(pair))) for pair in pairs],
                        differences.HEADER)


def varying(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """The override keys whose value is not the same in every row, in the order they were given."""
    keys = dict.fromkeys(key for row in rows for key in swept(row))
    return [key for key in keys if len({str(row.get(key)) for row in rows}) > 1]


def _varying_keys(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    keys = dict.fromkeys(key for row in rows for key in row)
    return [key for key in keys if not key.endswith(("_mean", "_sd")) and len({str(row.get(key)) for row in rows}) > 1]


def _plus_minus(mean: Optional[float], sd: Optional[float]) -> str:
    if mean is None:  # no job of the group completed
        return ""
    return f"{mean:.4f}" if sd is None or math.isnan(sd) else f"{mean:.4f} ± {sd:.4f}"


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]
    lines = [list(columns), *cells]
    return "\n".join("  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in lines)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    text = f"{value:.4f}" if isinstance(value, float) else str(value)
    text = " ".join(text.split())  # a row is one line: an error of several lines would break the table's columns
    return text if len(text) <= 80 else text[:77] + "..."


def markdown_table(header: Sequence[str], lines: Sequence[Sequence[Any]]) -> str:
    """A table in Markdown (report.md, python -m nli.report compare): a line of cells each."""
    rendered = [[_markdown_cell(value) for value in line] for line in lines]
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(line) + " |" for line in rendered)])


def _markdown_cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = f"{value:.4f}" if isinstance(value, float) else str(value)
    text = " ".join(text.split())  # a Markdown table row is one line: an error's traceback is not
    text = text if len(text) <= 300 else text[:299] + "…"
    return text.replace("|", "\\|")
