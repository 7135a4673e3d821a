"""What a sweep submitted, written as it submits each job: ``vertex_jobs.json`` in the sweep directory and
in the sweep's folder in the bucket (``<staging_bucket>/<sweep>``), so that the sweep can be found again
after its terminal is gone, from this machine or another: ``python -m nli.cloud attach|cancel|logs``.

It holds the sweep's Vertex AI project, region and endpoint (no secret: the jobs' secrets stay
references in their specs), the columns that tie a row to the sweep's table (nli.sweep.table), and each
submitted job's number, overrides, resource name and folders, and every job the launch was to submit.
Writing it is a help: a failure is one warning, and the sweep goes on.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Sequence

from omegaconf import DictConfig

from nli.contract import VERTEX_JOBS_FILE
from nli.io.storage import Storage
from nli.sweep import table as sweep

from .config import VertexLauncherConf

log = logging.getLogger(__name__)

JOBS_FILE = VERTEX_JOBS_FILE
VERSION = 1
SWEEP_LABEL = "hydra_sweep_id"  # each job's label: the id of the sweep that submitted it (nli.sweep.table)


class Submitted(Protocol):
    """What the record takes of a job (``_core.Job``, which imports this module)."""

    num: int
    overrides: List[str]
    config: DictConfig
    output_dir: Path
    remote_dir: str
    name: str


_SWEEPS: Dict[str, Dict[str, Any]] = {}  # sweep directory and sweep id -> its record, as written last
_LOCK = threading.Lock()  # the Optuna sweeper launches its trials from several threads (nli.sweep.slots)


def planned(jobs: Sequence[Submitted], settings: VertexLauncherConf, *, ran: Dict[str, Any]) -> None:
    """Records the jobs a launch is about to submit, before the first: a sweep whose launcher stopped before
    it submitted them all (at most max_concurrent_jobs run at once), or between a job's submission and its
    line here, is then seen to lack some, and ``attach`` looks for them rather than report the others as
    the whole sweep."""
    with _LOCK:
        for job in jobs:  # of one launch: one sweep, one record
            _add(_record(job, settings), "planned", _entry(job))
        if jobs:
            record = _record(jobs[0], settings)
            record["stamp"].update(ran)  # what the jobs run (image, commit): the columns of their rows, for attach
            _write(record)


def submitted(job: Submitted, settings: VertexLauncherConf) -> None:
    """Adds the job, just submitted, to its sweep's record, and writes the record in both places."""
    with _LOCK:
        record = _record(job, settings)
        _add(record, "jobs", {**_entry(job), "name": job.name})
        _write(record)


def unsubmitted(record: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The jobs the sweep planned that its record does not name as submitted (Vertex AI may still have one:
    ``SWEEP_LABEL`` finds it)."""
    submitted_nums = {each["num"] for each in record["jobs"]}
    return [each for each in record.get("planned", []) if each["num"] not in submitted_nums]


def _record(job: Submitted, settings: VertexLauncherConf) -> Dict[str, Any]:
    """The record of the job's sweep, as this process keeps it."""
    sweep_dir = Path(str(job.config.hydra.sweep.dir)).absolute()
    stamp = sweep.running_sweep(sweep_dir)
    remote = job.remote_dir.rstrip("/").rpartition("/")[0]
    return _SWEEPS.setdefault(f"{sweep_dir} {stamp.get(sweep.SWEEP_ID)} {remote}", {
        "version": VERSION, "sweep_name": remote.rpartition("/")[2], "project": settings.project,
        "region": settings.region, "api_endpoint": settings.api_endpoint, "poll_interval": settings.poll_interval,
        "sweep_dir": str(sweep_dir), "remote_dir": remote, "stamp": stamp, "jobs": [], "planned": []})


def _entry(job: Submitted) -> Dict[str, Any]:
    return {"num": job.num, "overrides": list(job.overrides), "remote_dir": job.remote_dir,
            "output_dir": str(job.output_dir.absolute())}


def _add(record: Dict[str, Any], key: str, entry: Dict[str, Any]) -> None:
    record[key] = sorted([each for each in record[key] if each["num"] != entry["num"]] + [entry],
                         key=lambda each: each["num"])


def _write(record: Dict[str, Any]) -> None:
    text = json.dumps(record, indent=1) + "\n"
    for where in (record["sweep_dir"], record["remote_dir"]):
        try:
            Storage(where, key="the sweep's record").write_text(JOBS_FILE, text)
        except Exception as error:  # gcsfs's HttpError, google-auth's RefreshError...: the sweep must go on
            log.warning("%s/%s could not be written (%s): `python -m nli.cloud` cannot find the sweep's jobs "
                        "there", where, JOBS_FILE, error)


def read(where: str) -> Optional[Dict[str, Any]]:
    """The record in the folder ``where`` (local or gs://); None where it has none."""
    return Storage(where, key="SWEEP").read_json(JOBS_FILE)
