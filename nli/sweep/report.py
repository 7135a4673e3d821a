"""A sweep's report: its table as Markdown, the seeds' means, and plots, in one ``report.md``.

    python -m nli.report multirun/synthetic/2026-11-25_06-54-23
    python -m nli.report SWEEP_A SWEEP_B outputs/rte/RUN --out reports/lr

Each argument is a sweep directory (one with ``sweep_results.jsonl``, written by ``train.py -m``,
nli/sweep/table.py), a single run folder (one with ``results.json``), or a Vertex AI sweep's folder in a
bucket (``gs://<staging_bucket>/<sweep name>``: its jobs' folders, or the table ``python -m nli.cloud
attach`` wrote there). Of a directory that several sweeps ran in (one after another: a sweep run
again), the report is of the newest sweep's jobs, and says how many older sweeps' rows it left out; where
the newest is a command that continued an Optuna search's study, of the study's trials, every command's
(nli.sweep.table.of_study). Of a sweep stopped part-way it says how many of its jobs, or of a search's
trials, ended.
The report goes to the first sweep directory given (else the first run folder; for a sweep in a
bucket, ``reports/<sweep name>`` in the current directory), or to ``--out``:

- ``report.md``: every job (state, the overrides that vary, objective and metrics, speed, error),
  and when seeds were swept the mean ± sample standard deviation over them;
- ``report_differences.csv`` (and its table in report.md), when seeds were swept: every two settings that
  differ in one swept value, the difference of their objectives' means with a 95% bootstrap interval and
  a permutation test, told apart or not (nli.sweep.differences);
- ``objective_vs_<key>.png``: the objective against each swept setting other than the seed;
- a per-class table: each class's precision, recall and F1 on each eval split (classification
  tasks), mean ± sd over the seeds of each setting;
- ``learning_curves.png``: training loss, the evaluation metric, the gradient norm (before clipping)
  and the learning rate against step, from each run's ``metrics.csv`` (``logger=csv``, the default): a line
  per setting, the mean over its seeds and a band from their least to their greatest value;
- ``reliability.png``: each eval split's reliability diagram, a line per run, the 10 of the highest objective
  (nli.sweep.calibration_plot).

Each plot has one legend, below its axes, in room the figure adds for it; past 10 settings (a search's trials)
the 5 of the highest objective are coloured and named, the others grey (nli.sweep.plots). A search that minimized
its objective (``hydra.sweeper.direction=minimize``, in the multirun.yaml Hydra writes at the sweep's top) has those
of the lowest instead, in both, and report.md says so. A report written again into the same folder removes the plots
of the earlier one that it no longer has (:func:`own_images`).

``python -m nli.report compare RUN_A RUN_B`` compares two runs on the same eval examples instead
(nli.sweep.compare); ``python -m nli.report submission DIR...`` makes GLUE's submission zip from runs'
test predictions (nli.sweep.leaderboard).

Failed jobs are in the tables and not in the plots. The plots are drawn on matplotlib's Agg
canvas, without pyplot: no display is needed and no global backend is switched for the caller.
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple, Union

import fsspec
import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from nli.config.keys import key_of
from nli.contract import (
    CONFIG_FILE,
    MULTIRUN_RECORD,
    OVERRIDES_FILE,
    RESULTS_FILE,
    VERTEX_JOB_RETURN_FILE,
    VERTEX_JOBS_FILE,
    VERTEX_MODEL_DIR,
    vertex_dirs,
)
from nli.errors import UserError
from nli.io.claim import held_since, live_holder
from nli.io.storage import Storage, file_in_the_way
from nli.sweep import calibration_plot, cost, differences, plots
from nli.sweep import table as sweep

REPORT = "report.md"
# The report's own differences: a sweep's sweep_differences.csv, beside which the report may be written, is that
# sweep's alone (nli.sweep.table), and a report may be of several sweeps and runs.
DIFFERENCES_CSV = "report_differences.csv"
COMPARE = "compare"  # python -m nli.report compare RUN_A RUN_B (nli.sweep.compare)
METRICS_CSV = "metrics.csv"
LEARNING_CURVES = "learning_curves.png"
# The run's own record of its command (nli.contract); Hydra's, in folders written before it.
OVERRIDES_FILES = (Path(OVERRIDES_FILE), Path(".hydra") / "overrides.yaml")
OBJECTIVE_SIZE = (6.0, 4.0)
CURVES_SIZE = (12.0, 8.0)
GRAD_NORM, LR = "train/grad_norm", "train/lr"  # the training series plotted under the loss (metrics.csv's names)
# Results that measure the run (speed, memory) rather than the model: shown apart, never averaged as metrics.
MEASURED_PREFIXES = ("train_", "peak_", "eval_examples")
# How fast each job ran, by the title the job table gives it.
SPEED = (("examples/s", "train_examples_per_second"), ("seconds", "train_seconds"))
COMMIT_CHARS = 10  # of a commit's hash in the table: enough to tell commits apart (git's short form is 7+)
PER_CLASS = "per_class"  # results.json's per-class figures (nli.evaluate.per_class): split -> label -> figure -> value
AVERAGED_FIGURES = ("precision", "recall", "f1")  # of each class, averaged over seeds (support is the split's)

Row = Dict[str, Any]
Source = Union[Path, str]  # a local folder, or a sweep's folder in a bucket (gs://...)
UNFINISHED = "UNFINISHED"  # a job of a sweep in a bucket that has written no result yet
Curves = Dict[str, Dict[int, float]]  # metric -> step -> value


class ReportError(UserError):
    """An argument that is neither a sweep directory nor a run folder, or a table that cannot be read."""


# ------------------------------------------------------------------------------- the rows


def load_rows(paths: Sequence[Source], notes: Optional[List[str]] = None) -> List[Row]:
    """Every job of every sweep directory (its newest sweep's, with its study's earlier commands') and run folder
    given, in order; a line in ``notes`` for each directory whose older sweeps' rows were left out. A ``gs://`` URL
    is a Vertex AI sweep's folder in a bucket (:func:`bucket_rows`). A run folder that is a job of a sweep given too
    (``SEARCH SEARCH/trial=0``) is its job's row alone: listed twice, it was counted as two runs of its setting."""
    said = notes if notes is not None else []
    given = once(paths)
    sweeps = {path: bucket_rows(path, said) if isinstance(path, str) else _sweep_rows(path, said)
              for path in given if isinstance(path, str) or (path / sweep.RESULTS_JSONL).is_file()}
    jobs = {_folder_key(str(row["output_dir"])): path for path, got in sweeps.items() for row in got
            if row.get("output_dir")}
    rows: List[Row] = []
    for path in given:
        if path in sweeps:
            rows.extend(sweeps[path])
            continue
        folder = Path(path)  # a bucket's URL is a sweep's, above
        if not (folder / RESULTS_FILE).is_file():
            raise _not_a_source(folder)
        if (of := jobs.get(_folder_key(str(folder)))) is not None:
            said.append(f"{folder}: a job of the sweep {of}, given too: listed once, as the sweep's job")
        else:
            rows.append(_run_row(folder, num=len(rows)))
    return rows


def _folder_key(folder: str) -> str:
    """What tells a local folder from another, however it is spelt (relative, with a trailing /); a bucket's URL
    as it is."""
    return folder.rstrip("/") if "://" in folder else str(Path(folder).resolve())


def once(paths: Sequence[Source]) -> List[Source]:
    """Each folder once, however often it is given (``sweep sweep``, ``sweep ./sweep/``): read twice, its jobs
    were listed twice, and each seed said to be in two jobs (a run of the submission 'the best of 2 runs')."""
    seen: Set[Source] = set()
    found: List[Source] = []
    for path in paths:
        key = path.rstrip("/") if isinstance(path, str) else path.resolve()
        if key not in seen:
            seen.add(key)
            found.append(path)
    return found


def _not_a_source(path: Path) -> ReportError:
    expected = f"expected a sweep directory (with {sweep.RESULTS_JSONL}) or a run folder (with {RESULTS_FILE})"
    if not path.exists():
        return ReportError(f"{path}: no such directory; {expected}")
    if not path.is_dir():
        return ReportError(f"{path}: not a directory; {expected}")
    # A sweep or a run just started writes its file as its first job, or the run, ends: said so, not "neither".
    storage = Storage(str(path), key="DIR")
    if (holder := live_holder(storage, use=sweep.CLAIM)) is not None:
        return ReportError(f"{path}: a sweep is running there ({holder}) and none of its jobs has ended yet: make "
                           f"the report once one has ({sweep.RESULTS_JSONL} then holds its row)")
    if (holder := live_holder(storage)) is not None:  # a run's claim of its output folder
        return ReportError(f"{path}: a run is still going there ({holder}): its {RESULTS_FILE} is written at its "
                           "end; make the report then")
    # Hydra's record of a sweep, and a run's of itself, are written as each starts; their tables at their ends.
    if (path / MULTIRUN_RECORD).is_file():
        return ReportError(f"{path}: the sweep there stopped before any of its jobs ended (its {MULTIRUN_RECORD}, no "
                           f"{sweep.RESULTS_JSONL}): the same command again runs them, a job stopped mid-way resuming "
                           "from its checkpoint; make the report once one has ended")
    if (path / CONFIG_FILE).is_file():
        return ReportError(f"{path}: the run there has not ended (its {CONFIG_FILE}, no {RESULTS_FILE}): it was "
                           "stopped, or failed, before its final evaluation; the same command again continues a "
                           "stopped run, and its train.log says why one failed")
    return ReportError(f"{path}: holds neither {sweep.RESULTS_JSONL} nor {RESULTS_FILE}; {expected}")


def _sweep_rows(sweep_dir: Path, notes: List[str]) -> List[Row]:
    """The rows of the newest sweep in the directory, with those of the earlier commands of its study where it is a
    search's: two unrelated sweeps' rows under one job number would pass one sweep's result off as the other's."""
    every = sweep.read_rows(sweep_dir, notes)
    rows, own = _newest(str(sweep_dir), every, notes)
    storage = Storage(str(sweep_dir), key="DIR")
    holder = live_holder(storage, use=sweep.CLAIM)
    since = held_since(storage, use=sweep.CLAIM) if holder is not None else None
    if holder is not None and since is not None and all(row.get(sweep.SWEEP_STARTED) != since for row in own):
        notes.append(f"{sweep_dir}: a sweep is running there ({holder}) and none of its jobs has ended yet; the "
                     f"report is of the sweep before it ({_sweep_name(own[0])})")
    elif holder is not None:  # a sweep still running: its table so far, said as such
        planned = _planned_jobs(sweep_dir, rows, own)
        of = f"of its {planned} jobs " if planned else ""
        notes.append(f"{sweep_dir}: the sweep is still running ({holder}); {len(own)} job(s) {of}have ended, and "
                     "the report is of those: make it again once the sweep ends")
    elif _started_since(sweep_dir, own) and (planned := _planned_jobs(sweep_dir, rows, [])):
        # A sweep stopped in its first job (Ctrl-C, SIGTERM) wrote no row: the table's newest sweep looks the last.
        notes.append(f"{sweep_dir}: a sweep started there since ({MULTIRUN_RECORD} is its record) stopped before any "
                     f"of its {planned} job(s) ended; the report is of the sweep before it ({_sweep_name(own[0])}): "
                     "the same command again runs that sweep's jobs, one stopped mid-way resuming from its checkpoint")
    elif (planned := _planned_jobs(sweep_dir, rows, own)) and len(own) < planned and _planned_by(sweep_dir, own) \
            and not _failed_too_often(sweep_dir, own, planned):
        # A sweep stopped part-way (Ctrl-C, SIGTERM, a lost machine) has no claim left: its table alone looks whole.
        notes.append(_stopped(sweep_dir, planned, rows, own))
    elif unended := _unended_jobs(sweep_dir, every):
        # A search continued by the same command again and stopped in its first trial: its record is as the last's.
        notes.append(f"{sweep_dir}: {', '.join(unended)}: a run that began and never ended, a job of no row of the "
                     "table (a job's row is written as it ends: one stopped mid-way by Ctrl-C or SIGTERM has none); "
                     "the report is of the jobs that ended, and the command that ran it, run again, resumes it")
    for row in rows:
        # A sweep copied from elsewhere (a cluster, a bucket) names job folders that are not here:
        # its metrics.csv files are then read from the same subfolder of the copy.
        named = str(row.get("output_dir") or "")
        if named and not _exists(named) and (sweep_dir / _tail(named, 1)).is_dir():
            row["output_dir"] = str(sweep_dir / _tail(named, 1))
    _name_as_resolved(rows)
    return rows


def _name_as_resolved(rows: List[Row]) -> None:
    """Each job's task and model as its folder's config.yaml resolved them, as a run folder's row names them; a job
    that failed before it wrote one (as it loaded), as the sweep's other jobs of the same typed value resolved it."""
    found: Dict[Tuple[str, str], str] = {}  # (key, value typed) -> the name resolved
    unresolved = []
    for row in rows:
        names = _resolved_names(Path(str(row["output_dir"]))) if _exists(str(row.get("output_dir") or "")) else {}
        found.update({(key, str(row[key])): name for key, name in names.items() if key in row})
        if names:
            row.update(names)
        else:
            unresolved.append(row)
    for row in unresolved:
        row.update({key: found[(key, str(row[key]))] for key in ("task", "model") if (key, str(row.get(key))) in found})


def _planned_jobs(sweep_dir: Path, rows: Sequence[Row], own: Sequence[Row]) -> Optional[int]:
    """How many jobs the newest sweep in ``sweep_dir`` runs, from Hydra's record of it (multirun.yaml): the product of
    the lengths of a list sweep's values, or an Optuna search's trials (:func:`_planned_trials`); None where it cannot
    tell."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        record = yaml.safe_load((sweep_dir / MULTIRUN_RECORD).read_text())["hydra"]
        if "n_trials" in (record.get("sweeper") or {}):
            return _planned_trials(record["sweeper"], list(record["overrides"]["task"]), rows, len(own))
        overrides = OverridesParser.create().parse_overrides(list(record["overrides"]["task"]))
        return math.prod(len(list(o.sweep_string_iterator())) for o in overrides if o.is_discrete_sweep())
    except Exception:  # a record of another version, or none: the note says less
        return None


GRID_SAMPLER = "optuna.samplers.GridSampler"  # conf/hydra/sweeper/sampler/grid.yaml


def _planned_trials(sweeper: Mapping[str, Any], overrides: Sequence[str], rows: Sequence[Row], ran: int) -> int:
    """The trials a search's command runs: its ``n_trials``; a grid search's, no more than the points its study had not
    tried as the command started (nli.sweep.search: the grid sampler runs out, where the others never do). Those are
    the ones it ``ran`` and those no row of the study's (``rows``, every command's) has tried: of a grid search that
    ran out, its ``ran`` alone."""
    n_trials = int(sweeper["n_trials"])
    if (sweeper.get("sampler") or {}).get("_target_") != GRID_SAMPLER:
        return n_trials
    from nli.sweep.search import grid, search_space  # Optuna: only for a grid search's report

    params = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
    points = grid(search_space([*params, *overrides])[0])
    # Each point as the trial's row writes its values (the search's overrides, as Hydra writes them back).
    every = {tuple(sweep.override_columns([f"{key}={value}" for key, value in zip(points, point)]).values())
             for point in itertools.product(*points.values())}
    tried = {tuple(str(row.get(key)) for key in points) for row in rows}
    return min(n_trials, ran + len(every - tried))


def _failed_too_often(sweep_dir: Path, own: Sequence[Row], planned: int) -> bool:
    """Whether a search ended itself before its trials, once more than its ``max_failure_rate`` of them failed (the
    command said so as it ended, with the first failure's error): not a search stopped part-way."""
    rate = _sweeper(sweep_dir).get("max_failure_rate")
    return sweep.is_number(rate) and len(sweep.failed(own)) / planned > rate


def _stopped(sweep_dir: Path, planned: int, rows: Sequence[Row], own: Sequence[Row]) -> str:
    """What the report says of a sweep stopped part-way: how many of its jobs ended, and what runs the others."""
    if "n_trials" not in _sweeper(sweep_dir):
        return (f"{sweep_dir}: {len(own)} of the sweep's {planned} jobs have ended, and the report is of those: the "
                "others never ended (the sweep was stopped, or they still run under a launcher elsewhere); the same "
                "command again runs them")
    earlier = f", with the study's {len(rows) - len(own)} trials of earlier commands" if len(rows) > len(own) else ""
    return (f"{sweep_dir}: {len(own)} of the {planned} trials of the search's last command have ended, and the report "
            f"is of those{earlier}: the others never ended (the search was stopped, or they still run under a launcher "
            "elsewhere); the same command again continues its study, first resuming a trial stopped mid-way, if any")


def _sweeper(sweep_dir: Path) -> Dict[str, Any]:
    """Hydra's record of the sweeper of the sweep in ``sweep_dir`` (multirun.yaml's ``hydra.sweeper``); empty where
    there is no record, or one of another kind (a run folder)."""
    try:
        sweeper = yaml.safe_load((sweep_dir / MULTIRUN_RECORD).read_text())["hydra"].get("sweeper") or {}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return {}
    return sweeper if isinstance(sweeper, dict) else {}


def sweep_direction(paths: Sequence[Source], notes: List[str]) -> str:
    """Which way the sweeps of ``paths`` sought their objective, and so which runs the report's plots call the best:
    minimize where each sweep directory that records a direction (the project's Optuna search) minimized; else
    maximize, as every objective of the project is higher-is-better (a list sweep, a run folder, a bucket's sweep).
    A line in ``notes`` where the sweeps given sought it both ways."""
    recorded = {_direction(path) for path in paths if isinstance(path, Path)} - {None}
    if len(recorded) > 1:
        notes.append("the sweeps given sought their objective both ways (hydra.sweeper.direction maximize and "
                     "minimize): the plots' best are those of the highest objective")
    return plots.MINIMIZE if recorded == {plots.MINIMIZE} else plots.MAXIMIZE


def _direction(sweep_dir: Path) -> Optional[str]:
    """The direction Hydra's record of the sweep in ``sweep_dir`` (multirun.yaml) gives its sweeper; None where it
    gives none (Hydra's basic sweeper) or there is no record."""
    direction = _sweeper(sweep_dir).get("direction")
    return direction if direction in (plots.MAXIMIZE, plots.MINIMIZE) else None


def _planned_by(sweep_dir: Path, rows: Sequence[Row]) -> bool:
    """Whether Hydra's record of a sweep (multirun.yaml, written as each sweep starts) is of the sweep of ``rows``:
    written after it started and before its first job ended, not by a sweep started there since."""
    started, ended = rows[0].get(sweep.SWEEP_STARTED), [row.get("ended") for row in rows]
    if not sweep.is_number(started) or not all(sweep.is_number(each) for each in ended):
        return False  # rows written before they said their sweep
    written = (sweep_dir / MULTIRUN_RECORD).stat().st_mtime
    return float(started) <= written <= min(float(each) for each in ended if sweep.is_number(each))


def _started_since(sweep_dir: Path, rows: Sequence[Row]) -> bool:
    """Whether Hydra's record of a sweep (multirun.yaml, written once as each sweep starts, not by one refused before
    it starts) is of a sweep started there since the jobs of ``rows`` ended, none of whose jobs has: written after
    them, and naming a key that none of them was given (a sweep copied from elsewhere has its files' times new)."""
    ended = [float(row["ended"]) for row in rows if sweep.is_number(row.get("ended"))]
    try:
        written = (sweep_dir / MULTIRUN_RECORD).stat().st_mtime
        typed = yaml.safe_load((sweep_dir / MULTIRUN_RECORD).read_text())["hydra"]["overrides"]["task"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return False
    given = {key_of(str(override)) for row in rows for override in row.get("overrides") or []}
    return bool(ended) and written > max(ended) and not {key_of(str(override)) for override in typed or []} <= given


def _unended_jobs(sweep_dir: Path, every: Sequence[Row]) -> List[str]:
    """The folders in ``sweep_dir`` of runs that began (config.yaml) and never ended (no results.json), that no row of
    any sweep there names and no live run holds: jobs stopped mid-way, which the command that ran them resumes."""
    named = {_tail(str(row.get("output_dir") or ""), 1) for row in every}  # by name: a copy's folders too
    return sorted(folder.name for folder in sweep_dir.iterdir()
                  if folder.is_dir() and folder.name not in named and (folder / CONFIG_FILE).is_file()
                  and not (folder / RESULTS_FILE).is_file()
                  and live_holder(Storage(str(folder), key="DIR")) is None)


def _newest(where: str, every: List[Row], notes: List[str]) -> Tuple[List[Row], List[Row]]:
    """The rows of the newest sweep in ``every`` with those of the earlier commands of its study where it is a
    search's (nli.sweep.table.of_study), and the newest sweep's own rows. A line in ``notes`` where the rows of
    other sweeps are left out."""
    if not every:
        raise ReportError(f"{where}/{sweep.RESULTS_JSONL} holds no jobs yet")
    own, older = sweep.newest_sweep(every)
    rows = sweep.of_study(every, own[0].get(sweep.SWEEP_ID))
    studies = {row.get(sweep.STUDY) for row in own} - {None}
    others = {row.get(sweep.SWEEP_ID) for row in every if row.get(sweep.SWEEP_ID) in older
              and row.get(sweep.STUDY) not in studies}
    if others:
        continued = len(older) - len(others)
        of = f" and the {continued} earlier command(s) of its study ({_study_name(studies)})" if continued else ""
        left_out = sum(row.get(sweep.SWEEP_ID) in others for row in every)
        notes.append(f"{where} holds the rows of {len(older) + 1} sweeps: the report is of the newest "
                     f"({_sweep_name(own[0])}){of}; the {left_out} rows of the older ones are left out "
                     f"(they stay in {sweep.RESULTS_JSONL})")
    return rows, own


def _study_name(studies: Set[Any]) -> str:
    """A study as the rows name it (nli.sweep.search.study_key: its name, then its token), by its name."""
    return ", ".join(f"study {str(study).rpartition(' ')[0] or study}" for study in sorted(studies, key=str))


# ------------------------------------------------------------------------- a sweep in a bucket


def bucket_rows(url: str, notes: List[str]) -> List[Row]:
    """The jobs of a Vertex AI sweep's folder in a bucket (``<staging_bucket>/<sweep>``): its table where
    ``python -m nli.cloud attach`` wrote one there, else a row per job folder (``0/``, ``1/``, ...) from
    what each job wrote into its ``model/`` (results.json, the job's return or error), with the
    overrides the sweep recorded as it submitted it (vertex_jobs.json), else the run's own."""
    folder = Storage(url.rstrip("/"), key="DIR")
    try:
        if not folder.check_readable():
            raise ReportError(f"{url}: nothing there; expected the folder of a Vertex AI sweep, <staging_bucket>/"
                              "<sweep name> (gcloud storage ls lists it)")
        if folder.exists(sweep.RESULTS_JSONL):
            text = folder.read_bytes(sweep.RESULTS_JSONL).decode()
            return _newest(folder.url, sweep.parse_rows(text, f"{folder.url}/{sweep.RESULTS_JSONL}", notes), notes)[0]
        recorded = {int(job["num"]): job for job in (folder.read_json(VERTEX_JOBS_FILE) or {}).get("jobs", [])}
        numbers = sorted(int(name) for name in folder.list("") if name.isdigit())
        rows = [_job_folder_row(folder, num, recorded.get(num)) for num in numbers]
    except json.JSONDecodeError as err:
        raise ReportError(f"{url}: a file of the sweep is not JSON ({err})") from None
    except UserError as err:  # a StorageError: the bucket, the credentials or the network, with the fix
        raise err if isinstance(err, ReportError) else ReportError(str(err)) from None
    except OSError as err:  # gcsfs' errors: no credentials, no network, no permission
        raise ReportError(f"{url} cannot be read: {err}") from None
    if not rows:
        raise ReportError(f"{url}: holds neither {sweep.RESULTS_JSONL} nor job folders (0/, 1/, ...): expected the "
                          "folder of a Vertex AI sweep, <staging_bucket>/<sweep name>")
    return rows


def _job_folder_row(folder: Storage, num: int, recorded: Optional[Mapping[str, Any]]) -> Row:
    model = vertex_dirs(str(num))[VERTEX_MODEL_DIR]  # where the job's run wrote (AIP_MODEL_DIR)
    results = folder.read_json(f"{model}/{RESULTS_FILE}")
    reported = folder.read_json(f"{model}/{VERTEX_JOB_RETURN_FILE}") or {}
    if recorded is not None:
        overrides = [str(each) for each in recorded.get("overrides", [])]
    else:
        written = folder.read_bytes(f"{model}/{OVERRIDES_FILE}") if folder.exists(f"{model}/{OVERRIDES_FILE}") else b""
        overrides = [str(each) for each in yaml.safe_load(written) or []]
    row = functools.partial(sweep.job_row, num=num, overrides=overrides, output_dir=folder.describe(model))
    if reported.get("status", sweep.COMPLETED if results else None) == sweep.COMPLETED and results is not None:
        return row(state=sweep.COMPLETED, results=sweep.own_results(results, reported.get("return_value"),
                                                                    folder.describe(model)))
    if "error" in reported or reported.get("status") == sweep.FAILED:
        return row(state=sweep.FAILED, results=None, error=str(reported.get("error") or "the job failed"))
    return row(state=UNFINISHED, results=None,
               error=f"no {RESULTS_FILE} yet: running, or ended without reporting (python -m nli.cloud attach says)")


def _run_row(run_dir: Path, *, num: int) -> Row:
    """A single run's row, as a sweep would have written it."""
    try:
        results = json.loads((run_dir / RESULTS_FILE).read_text())
        overrides_file = next((run_dir / each for each in OVERRIDES_FILES if (run_dir / each).is_file()), None)
        overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file is not None else []
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ReportError(f"{run_dir}: unreadable {RESULTS_FILE} or {OVERRIDES_FILE} ({err})") from None
    if not isinstance(results, dict):  # JSON, but not what a run writes: a file damaged or replaced
        raise ReportError(f"{run_dir}: {RESULTS_FILE} is damaged (not a JSON object): run it again, or leave it out")
    if not isinstance(overrides or [], list):
        raise ReportError(f"{run_dir}: {OVERRIDES_FILE} is damaged (not a list of overrides): run it again, or "
                          "leave it out")
    row = sweep.job_row(num=num, state=sweep.COMPLETED, overrides=[str(each) for each in overrides or []],
                        results=results, output_dir=str(run_dir))
    # What ran, not what was typed: two runs typed differently (model=tiny, or through experiment=) compare
    # by the task and model they resolved.
    row.update(_resolved_names(run_dir))
    return row


def _resolved_names(run_dir: Path) -> Dict[str, str]:
    """The task and model a run folder's config.yaml resolved (not only the overrides typed: a run of the
    defaults typed neither): the model by its path or Hub id, or as built from scratch."""
    try:
        config = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    task, model = (config.get("task") or {}, config.get("model") or {}) if isinstance(config, dict) else ({}, {})
    scratch = model.get("scratch") or {}
    built = f"{scratch.get('model_type')} from scratch, {scratch.get('num_hidden_layers')} layers of " \
        f"{scratch.get('hidden_size')}" if scratch else None
    names = {"task": task.get("name"), "model": model.get("name_or_path") or built}
    return {key: str(value) for key, value in names.items() if value}


def _sweep_name(row: Mapping[str, Any]) -> str:
    sweep_id = row.get(sweep.SWEEP_ID)
    return f"sweep {sweep_id}" if sweep_id else "rows that name no sweep"


def _exists(url: str) -> bool:
    if "://" in url:  # a bucket: let fsspec answer when the file is read
        return True
    return Path(url).is_dir()


def _tail(url: str, parts: int) -> str:
    """The last parts of a path or URL: enough to tell runs apart in a table."""
    return "/".join(url.rstrip("/").split("/")[-parts:])


def model_metrics(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """Objective first, then what the model scored (accuracy, f1, ...), not how fast the run went."""
    return [name for name in sweep.metric_columns(rows) if not name.startswith(MEASURED_PREFIXES)]


def completed(rows: Sequence[Row]) -> List[Row]:
    return [row for row in rows if row.get("state") == sweep.COMPLETED and sweep.is_number(row.get("objective"))]


def _number(value: Any) -> Optional[float]:
    return float(value) if sweep.is_number(value) else None


# ------------------------------------------------------------------------------ the tables


def job_table(rows: Sequence[Row], keys: Sequence[str], metrics: Sequence[str], *, folders: bool) -> str:
    """One line per job; ``folders`` adds each job's folder, for reports over several directories
    (whose job numbers repeat)."""
    columns: List[Tuple[str, str]] = [("job", "job"), ("state", "state")]
    columns += [("folder", "output_dir")] if folders else []
    columns += [(key, key) for key in keys] + [(name, name) for name in metrics]
    columns += [(title, key) for title, key in SPEED if any(key in row for row in rows)]
    columns += [(key, key) for key in cost.COLUMNS if any(key in row for row in rows)]  # what each job used
    if any(row.get(sweep.COMMIT) for row in rows):  # the code each job ran (nli.runtime.provenance)
        columns.append(("commit", sweep.COMMIT))
    if any(row.get("error") for row in rows):
        columns.append(("error", "error"))
    numeric = {*metrics, *(key for _, key in SPEED), *cost.COLUMNS}
    lines = [[_shown(row, key, numeric) for _, key in columns] for row in rows]
    return sweep.markdown_table([title for title, _ in columns], lines)


def _shown(row: Mapping[str, Any], key: str, numeric: Set[str]) -> Any:
    """A cell's value: every metric as a float, so that all print with 4 decimals; a folder by its
    last two parts (the sweep's and the job's)."""
    if key == "output_dir":
        return _tail(str(row.get(key) or ""), 2)
    if key == sweep.COMMIT:
        return short_commit(row)
    value = row.get(key)
    return _number(value) if key in numeric and sweep.is_number(value) else value


def short_commit(row: Mapping[str, Any]) -> Optional[str]:
    """A job's commit as git abbreviates it, marked where its checkout had uncommitted changes."""
    commit = row.get(sweep.COMMIT)
    if not commit:
        return None
    return f"{str(commit)[:COMMIT_CHARS]}{' (dirty)' if row.get(sweep.DIRTY) else ''}"


def seed_table(rows: Sequence[Row], keys: Sequence[str], metrics: Sequence[str]) -> str:
    """Jobs that differ only in seed, one line each: n, and mean ± sd of every metric."""
    groups = sweep.seed_groups(rows)
    others = [key for key in keys if key != sweep.SEED]
    failed = any(group["failed"] for group in groups)
    pruned = any("pruned" in group for group in groups)  # by a search's pruner: in no mean
    header = [*others, "n", *(["failed"] if failed else []), *(["pruned"] if pruned else []), *metrics]
    lines = [[*(group.get(key) for key in others), group["n"], *([group["failed"]] if failed else []),
              *([group.get("pruned", 0)] if pruned else []),
              *(plus_minus(group.get(f"{name}_mean"), group.get(f"{name}_sd")) for name in metrics)]
             for group in groups]
    return sweep.markdown_table(header, lines)


def class_table(rows: Sequence[Row], keys: Sequence[str]) -> Optional[str]:
    """Each class's precision, recall and F1 on each eval split (results.json's ``per_class``, nli.evaluate.per_class),
    one line per setting x split x label: n, and mean ± sd over the setting's seeds; None where no
    completed job has them (a regression, a run from before they were kept)."""
    others = [key for key in keys if key != sweep.SEED]
    groups: Dict[Tuple[Any, ...], List[Row]] = {}
    for row in completed(rows):
        if isinstance(row.get(PER_CLASS), dict):
            groups.setdefault(tuple(row.get(key) for key in others), []).append(row)
    lines: List[List[Any]] = []
    for setting, members in groups.items():
        tables = [row[PER_CLASS] for row in sweep.one_per_seed(members)]  # a seed given twice counts once
        for split in dict.fromkeys(split for table in tables for split in table):
            found: Dict[str, List[Mapping[str, Any]]] = {}
            for table in tables:
                for label, figures in (table.get(split) or {}).items():
                    found.setdefault(label, []).append(figures)
            for label, each in found.items():
                supports = sorted({figures.get("support") for figures in each}, key=str)
                lines.append([*setting, split, label, len(each),
                              *(_mean_sd([figures.get(name) for figures in each]) for name in AVERAGED_FIGURES),
                              supports[0] if len(supports) == 1 else " / ".join(map(str, supports))])
    if not lines:
        return None
    return sweep.markdown_table([*others, "split", "label", "n", *AVERAGED_FIGURES, "support"], lines)


def _mean_sd(values: Sequence[Any]) -> str:
    numbers = [float(value) for value in values if sweep.is_number(value)]
    return plus_minus(*sweep.mean_sd(numbers))


def plus_minus(mean: Optional[float], sd: Optional[float]) -> str:
    """``0.8229 ± 0.1915``; the mean alone where one seed ran (no sd), nothing where none did."""
    if mean is None or math.isnan(mean):
        return ""
    return f"{mean:.4f}" if sd is None or math.isnan(sd) else f"{mean:.4f} ± {sd:.4f}"


# ------------------------------------------------------------------------ objective plots


def objective_points(rows: Sequence[Row], key: str, others: Sequence[str]) -> Dict[str, Dict[str, List[float]]]:
    """The completed jobs' objectives, by the other swept values (a line each) and then by this key's
    value (a point each): the seeds of one setting fall in one point."""
    lines: Dict[str, Dict[str, List[float]]] = {}
    for row in completed(rows):
        label = ", ".join(f"{other}={row.get(other)}" for other in others)
        lines.setdefault(label, {}).setdefault(str(row.get(key)), []).append(float(row["objective"]))
    return lines


def x_axis(values: Sequence[str]) -> Tuple[Dict[str, float], str]:
    """Where each value lies on the x axis, and the axis' scale: numbers where all are numbers, on a
    log axis when they span more than a factor of 10 (learning rates), else categories in order."""
    try:
        numbers = {value: float(value) for value in values}
    except ValueError:
        return {value: float(i) for i, value in enumerate(values)}, "category"
    finite = [x for x in numbers.values() if math.isfinite(x)]
    spread = len(finite) == len(numbers) and min(finite) > 0 and max(finite) > 10 * min(finite)
    return numbers, "log" if spread else "linear"


TICKS_TYPED = 8  # values at most given a tick each, as typed; more (a search's trials) crowd the axis
TICK_CHARS = 8  # of a value typed, at most, for its tick: a search's drawn values are read from matplotlib's ticks


def objective_figure(rows: Sequence[Row], key: str, others: Sequence[str], *, seeds: bool,
                     direction: str = plots.MAXIMIZE) -> Figure:
    """The objective against ``key``, a line per setting of the ``others``; the axes :data:`OBJECTIVE_SIZE` and the
    legend below them (nli.sweep.plots): up to LEGEND_MAX lines each coloured and named, past that the best
    COLOURED (by their mean objective, the lowest where ``direction`` is minimize) and the others grey, unnamed (a
    search's trials, a line of one point each)."""
    lines = objective_points(rows, key, others)
    where, scale = x_axis(list(dict.fromkeys(value for points in lines.values() for value in points)))
    figure = plots.figure(OBJECTIVE_SIZE)
    axes = figure.subplots()
    best = plots.ranked({label: [value for values in points.values() for value in values]
                         for label, points in lines.items()}, direction)
    colours = plots.highlighted(best)
    handles: List[Any] = []
    labels: List[str] = []
    for label in reversed(best):  # the best drawn last, over the grey
        points = lines[label]
        ordered = sorted(points, key=lambda value: where[value])
        # A setting whose seeds' objectives are not all numbers is no point (matplotlib leaves a NaN out).
        figures = [sweep.mean_sd(points[value]) for value in ordered]
        means, sds = [mean for mean, _ in figures], [0.0 if math.isnan(sd) else sd for _, sd in figures]
        colour = colours[label]
        drawn = axes.errorbar([where[value] for value in ordered], means, yerr=sds, fmt="o-", capsize=4,
                              color=colour, zorder=2 if plots.named(colour) else 1)
        if plots.named(colour) and label:
            handles.insert(0, drawn)
            labels.insert(0, plots.short_label(label))
    if scale != "category":
        axes.set_xscale(scale)
    if scale == "category":
        plots.category_ticks(axes, list(where.values()), list(where))
    elif len(where) <= TICKS_TYPED and all(len(value) <= TICK_CHARS for value in where):
        # A tick at each value swept, as typed: 1e-3 rather than 0.00100 crowded among 0.00125s.
        axes.set_xticks(list(where.values()), list(where))
        axes.minorticks_off()
    axes.set(title=f"objective against {key}", xlabel=key,
             ylabel="objective (mean ± sd over seeds)" if seeds else "objective")
    title = (f"the {plots.best(direction)} {len(labels)} of {len(best)} by objective; the others grey"
             if len(best) > len(labels) and labels else None)
    plots.legend_below(figure, handles, labels, title=title)
    return figure


def plot_objective(rows: Sequence[Row], key: str, others: Sequence[str], path: Path, *, seeds: bool,
                   direction: str = plots.MAXIMIZE) -> None:
    plots.save(objective_figure(rows, key, others, seeds=seeds, direction=direction), path)


# ------------------------------------------------------------------------ learning curves


def read_curves(url: str) -> Curves:
    """metrics.csv as metric -> step -> value. A resumed run logs again the steps after its last
    checkpoint: the later line is the one that run went on from, so it wins. A row that is not a step, a metric
    and a number (one a full disk cut short, under code that did not take it back) is a ValueError naming the file
    and its line."""
    curves: Curves = {}
    with fsspec.open(url, "r") as stream:
        lines = csv.DictReader(stream)
        for line in lines:
            try:
                curves.setdefault(line["metric"], {})[int(line["step"])] = float(line["value"])
            except (TypeError, ValueError):  # a missing cell is None
                raise ValueError(f"{url}, line {lines.line_num}: not a row of step, metric and value "
                                 f"({','.join(cell or '' for cell in line.values() if isinstance(cell, str))!r})"
                                 ) from None
    return curves


def main_metric(results: Mapping[str, Any], curves: Curves) -> Optional[str]:
    """The eval/ metric the objective is: the one whose final value (results.json's, else the last
    logged) equals the objective; else the first eval/ metric logged."""
    names = [name for name in curves if name.startswith("eval/") and curves[name]]
    objective = _number(results.get("objective"))
    for name in names:
        points = curves[name]
        final = _number(results.get(name[len("eval/"):], points[max(points)]))
        if objective is not None and final is not None and math.isclose(final, objective):
            return name
    return names[0] if names else None


class Run(NamedTuple):
    """A completed run's learning curves: ``label`` its swept values, ``setting`` those other than the seed (the
    seeds of one setting share it: one line and band in the plot), its main eval/ metric, and its objective."""

    label: str
    curves: Curves
    metric: Optional[str]
    setting: str
    objective: float


def load_curves(rows: Sequence[Row], keys: Sequence[str]) -> Tuple[List[Run], List[str]]:
    """Each completed run's curves; and a note for each run without curves."""
    runs: List[Run] = []
    notes: List[str] = []
    for row in completed(rows):
        url = f"{str(row.get('output_dir', '')).rstrip('/')}/{METRICS_CSV}"
        try:
            curves = read_curves(url)
        except FileNotFoundError:
            notes.append(f"job {row.get('job')} ({url}): no {METRICS_CSV}")
            continue
        except (OSError, KeyError, ValueError) as err:  # unreadable, or not the step,metric,value columns
            notes.append(f"job {row.get('job')} ({url}): {METRICS_CSV} unreadable ({err!r})")
            continue
        label = ", ".join(f"{key}={row.get(key)}" for key in keys) or f"job {row.get('job')}"
        setting = ", ".join(f"{key}={row.get(key)}" for key in keys if key != sweep.SEED) or \
            ("" if sweep.SEED in keys else label)  # "": the seeds alone were swept, all one setting
        runs.append(Run(label, curves, main_metric(row, curves), setting, float(row["objective"])))
    return runs, notes


PANELS = (("train/loss", "training loss"), (None, "evaluation"), (GRAD_NORM, "gradient norm, before clipping"),
          (LR, "learning rate"))  # None: each run's main eval/ metric


def curves_figure(runs: Sequence[Run], direction: str = plots.MAXIMIZE) -> Figure:
    """Training loss and the evaluation metric against step, side by side; below them the gradient norm before
    clipping and the learning rate (of the first parameter group). A line per setting, the mean over its seeds
    with a band from their least to their greatest value; up to LEGEND_MAX settings each coloured and named in one
    legend below the axes, past that the best COLOURED (by their mean objective, the lowest where ``direction`` is
    minimize) and the others grey, unnamed. The axes take :data:`CURVES_SIZE` whatever the legend's length
    (nli.sweep.plots)."""
    figure = plots.figure(CURVES_SIZE)
    grid = figure.subplots(2, 2, sharex=True)
    panels = [axes for row in grid for axes in row]
    settings: Dict[str, List[Run]] = {}
    for run in runs:
        settings.setdefault(run.setting, []).append(run)
    best = plots.ranked({setting: [run.objective for run in seeds] for setting, seeds in settings.items()}, direction)
    colours = plots.highlighted(best)
    handles: List[Any] = []
    labels: List[str] = []
    for setting in reversed(best):  # the best drawn last, over the grey
        seeds, colour = settings[setting], colours[setting]
        lines = [_band(axes, [_series(run, name) for run in seeds], colour) for axes, (name, _) in zip(panels, PANELS)]
        if plots.named(colour):
            handles.insert(0, next((line for line in lines if line is not None), lines[0]))
            labels.insert(0, plots.short_label(seeds[0].label) if len(seeds) == 1 else
                          f"{plots.short_label(setting)} ({len(seeds)} seeds)" if setting else f"{len(seeds)} seeds")
    metrics = list(dict.fromkeys(run.metric for run in runs if run.metric))
    logged = any(run.curves.get(GRAD_NORM) for run in runs)  # runs from before it was logged have none
    ylabels = ["train/loss", ", ".join(metrics) or "no eval/ metric logged",
               GRAD_NORM if logged else f"no {GRAD_NORM} logged", LR]
    for i, (axes, (_, title), ylabel) in enumerate(zip(panels, PANELS, ylabels)):
        axes.set(title=title, ylabel=ylabel, **({"xlabel": "step"} if i >= 2 else {}))
    notes = [f"the {plots.best(direction)} {len(labels)} of {len(best)} settings by objective; the others grey"] \
        if len(best) > len(labels) else []
    if any(len(seeds) > 1 for seeds in settings.values()):
        notes.append("a setting's seeds: their mean, shaded from the least to the greatest")
    kept = [(handle, label) for handle, label in zip(handles, labels) if handle is not None]
    plots.legend_below(figure, [handle for handle, _ in kept], [label for _, label in kept],
                       title="; ".join(notes) or None)
    return figure


def _series(run: Run, name: Optional[str]) -> Mapping[int, float]:
    metric = run.metric if name is None else name
    return run.curves.get(metric, {}) if metric else {}


def _band(axes: Axes, seeds: Sequence[Mapping[int, float]], colour: Optional[str]) -> Optional[Any]:
    """The seeds' mean at each step any of them logged, shaded from their least to their greatest value; the line
    drawn (None where no seed logged the series)."""
    steps = sorted({step for points in seeds for step in points})
    if not steps:
        return None
    values = [[points[step] for points in seeds if step in points] for step in steps]
    grey = not plots.named(colour)
    (line,) = axes.plot(steps, [sum(each) / len(each) for each in values], marker="." if not grey else None,
                        color=colour, linewidth=0.8 if grey else 1.5, zorder=1 if grey else 2)
    if len(seeds) > 1 and not grey:
        axes.fill_between(steps, [min(each) for each in values], [max(each) for each in values], color=colour,
                          alpha=0.2, linewidth=0)
    return line


def plot_curves(runs: Sequence[Run], path: Path, direction: str = plots.MAXIMIZE) -> None:
    plots.save(curves_figure(runs, direction), path)


# ------------------------------------------------------------------------------ the report


def write_report(paths: Sequence[Source], out: Optional[Path] = None, notes: Optional[List[str]] = None
                 ) -> List[Path]:
    """Writes report.md and its plots; the files written, report.md first. ``notes`` gets a line for
    each directory whose older sweeps were left out (report.md says it too)."""
    notes, paths = [] if notes is None else notes, once(paths)
    rows = load_rows(paths, notes)
    out = out or _default_out(paths)
    out.mkdir(parents=True, exist_ok=True)
    keys, metrics = sweep.varying(rows), model_metrics(rows)
    notes += sweep.repeated_seeds(rows) if sweep.SEED in keys else []
    done, direction = completed(rows), sweep_direction(paths, notes)
    sections = [f"# Sweep report\n\n{len(rows)} {'job' if len(rows) == 1 else 'jobs'}, {len(done)} completed, "
                "from " + ", ".join(f"`{path}`" for path in paths) + "." +
                "".join(f"\n\n{note}." for note in notes) + _minimized(direction),
                "## Jobs\n\n" + job_table(rows, keys, metrics, folders=len(paths) > 1) + cost.markdown_note(rows),
                *warnings_section(rows, keys, folders=len(paths) > 1)]
    if sweep.SEED in keys:
        sections.append("## Over seeds\n\nMean ± sample standard deviation over the seeds of each setting "
                        "(completed jobs).\n\n" + seed_table(rows, keys, metrics))
    written: List[Path] = []
    sections += _differences_section(rows, out, written)
    classes = class_table(rows, keys)
    if classes is not None:
        sections.append("## Per class\n\nEach class's precision, recall and F1 on each eval split of the final "
                        "evaluation (`per_class` in results.json), mean ± sample standard deviation over the seeds "
                        "of each setting (completed jobs); support: the split's examples of the class.\n\n" + classes)
    sections += _objective_section(rows, keys, out, written, direction)
    sections += _curves_section(rows, keys, out, written, direction)
    sections += calibration_plot.section(done, keys, out, written, direction)  # reliability diagrams
    report = out / REPORT
    earlier = own_images(report)  # the plots of a report written here before, read before this one replaces it
    sweep.replace(report, "\n\n".join(sections) + "\n")  # a reader, or a report made at once, sees one whole
    for stale in earlier - {path.name for path in written}:  # of a setting, a split, a curve there is no more
        (out / stale).unlink(missing_ok=True)
    return [report, *written]


# The names of the plots a report writes (nli.sweep.calibration_plot's too): of those its report.md shows, the ones
# a report written again into the same folder does not write again are removed; no other file is.
OWN_IMAGE = re.compile(r"objective_vs_[\w.-]+\.png|" + re.escape(LEARNING_CURVES) + "|"
                       + re.escape(calibration_plot.RELIABILITY))


def own_images(report: Path) -> Set[str]:
    """The plots the report at ``report`` shows, by their names in the folder: a report's own files, which a report
    written again there replaces or removes (a user's own files beside it, named in no report.md, stay)."""
    try:
        text = report.read_text()
    except (OSError, UnicodeDecodeError):
        return set()
    return {name for name in re.findall(r"!\[[^\]]*\]\(([^)/\\]+)\)", text) if OWN_IMAGE.fullmatch(name)}


def warnings_section(rows: Sequence[Row], keys: Sequence[str], *, folders: bool = False) -> List[str]:
    """What each run said of its own figures (results.json's ``warnings``: a model that predicts one class, outputs
    that are NaN), under its job's swept values; nothing where no run warned. ``folders`` names each job's folder
    too, as the jobs' table does for reports over several directories, whose job numbers repeat."""
    def job(row: Row) -> str:
        # The keys this job was given: another sweep's key is none of its settings ("seed=None" it never ran with).
        values = " ".join(f"{key}={row[key]}" for key in keys if row.get(key) is not None)
        name = f"job {row['job']} of {_tail(str(row.get('output_dir') or ''), 2)}" if folders else f"job {row['job']}"
        return f"{name} ({values})" if values else name

    lines = [f"- {job(row)}: {warning}" for row in rows for warning in row.get("warnings") or []]
    if not lines:
        return []
    return ["## Warnings\n\nWhat the runs said of their own figures (`warnings` in results.json).\n\n"
            + "\n".join(lines)]


def _differences_section(rows: Sequence[Row], out: Path, written: List[Path]) -> List[str]:
    """Every two settings that differ in one swept value, told apart or not (nli.sweep.differences), in
    report.md and report_differences.csv; nothing where seeds were not swept."""
    pairs = sweep.setting_pairs(rows)
    path = out / DIFFERENCES_CSV
    sweep.replace_or_remove(path, differences.records(pairs))  # an earlier report's, of pairs there are no more
    if not pairs:
        return []
    written.append(path)
    lines = [differences.cells(pair) for pair in pairs]
    return [f"## Differences between settings\n\n{differences.EXPLAINED}.\n\n"
            + sweep.markdown_table(differences.HEADER, lines)]


def _default_out(paths: Sequence[Source]) -> Path:
    """The first sweep directory given, else the first run folder; for a sweep in a bucket, which a
    report is not written into, reports/<its name> here."""
    first = next((path for path in paths if isinstance(path, str) or (path / sweep.RESULTS_JSONL).is_file()),
                 paths[0])
    return Path("reports", first.rstrip("/").rpartition("/")[2]) if isinstance(first, str) else first


def _minimized(direction: str) -> str:
    """What report.md says of a search that minimized its objective: its plots' best are its lowest (where a reader
    takes the best of a score for its highest)."""
    return ("" if direction != plots.MINIMIZE else "\n\nThe sweep minimized its objective (`hydra.sweeper.direction="
            "minimize`): the plots' best are the runs of the lowest objective.")


def _objective_section(rows: Sequence[Row], keys: Sequence[str], out: Path, written: List[Path],
                       direction: str) -> List[str]:
    settings = [key for key in keys if key != sweep.SEED]
    if not settings or not completed(rows):
        return []
    images = []
    for key in settings:
        path = out / f"objective_vs_{_file_name(key)}.png"
        plot_objective(rows, key, [other for other in settings if other != key], path, seeds=sweep.SEED in keys,
                       direction=direction)
        written.append(path)
        images.append(f"![objective against {key}]({path.name})")
    return ["## Objective against each swept setting\n\n" + "\n\n".join(images)]


def _file_name(key: str) -> str:
    """An override key as part of a file name: ``hydra/launcher`` -> ``hydra_launcher``."""
    return re.sub(r"[^\w.-]+", "_", key)


def _curves_section(rows: Sequence[Row], keys: Sequence[str], out: Path, written: List[Path],
                    direction: str) -> List[str]:
    runs, notes = load_curves(rows, keys)
    text = "## Learning curves"
    if runs:
        plot_curves(runs, out / LEARNING_CURVES, direction)
        written.append(out / LEARNING_CURVES)
        text += f"\n\n![learning curves]({LEARNING_CURVES})"
    if notes:
        text += "\n\nSkipped:\n\n" + "\n".join(f"- {note}" for note in notes)
    return [text] if runs or notes else []


def source(argument: str) -> Source:
    """A folder as given: a URL stays text (Path would make gs://b of gs:/b)."""
    return argument if "://" in argument else Path(argument)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [COMPARE]:  # two runs on the same examples (a folder named so: ./compare)
        from nli.sweep import compare  # scikit-learn and SciPy, 2 s to import: only for this

        return compare.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m nli.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=source, metavar="DIR",
                        help="sweep directories and run folders; gs://: a Vertex AI sweep's folder in a bucket")
    parser.add_argument("--out", type=Path, help="where report.md and the plots go (default: the first sweep)")
    args = parser.parse_args(argv)
    notes: List[str] = []
    try:
        if args.out is not None and (blocker := file_in_the_way(args.out)) is not None:  # before any work
            raise ReportError(f"--out {args.out}: {blocker} is a file, where a folder is needed for {REPORT} and its "
                              "plots: give --out a folder (made if missing)")
        written = write_report(args.paths, args.out, notes)
    except UserError as err:  # what was given: the message alone, and argparse's status for a bad argument
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a folder that cannot be read or written: no traceback either
        print(f"error: {err}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print("\n".join(str(path) for path in written))
    return 0

