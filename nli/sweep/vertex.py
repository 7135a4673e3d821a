"""A Vertex AI sweep that outlives its terminal: find its jobs again, follow them, cancel them, read a log.

    python -m nli.cloud attach SWEEP [--logs N] [--interval SECONDS]
    python -m nli.cloud cancel SWEEP
    python -m nli.cloud logs SWEEP --job N

SWEEP is the sweep's local folder (its ``hydra.sweep.dir``) or its folder in the bucket
(``<staging_bucket>/<sweep name>``): both hold ``vertex_jobs.json``, which ``hydra/launcher=vertex``
writes as it submits each job (a sweep launched with ``hydra.launcher.wait=false``, or whose terminal
closed while it waited).

- ``attach`` polls the jobs through Vertex AI until every one has ended, printing each job's state and
  console link as it changes, and fills the sweep's table as each job ends: the same rows, in the same
  ``sweep_results.jsonl`` and ``.csv``, that a launcher that waits writes (of a local SWEEP, in that
  folder; of a gs:// SWEEP, in the bucket's). At the end it prints the table, as the sweep would have.
  ``--logs N`` prints job N's output as it comes (from Cloud Logging). Ctrl-C detaches: the jobs go
  on, and ``attach`` can be run again. Jobs the sweep's launcher stopped before submitting (it runs at
  most max_concurrent_jobs at once) are named, with the command that runs them. Exit status: 0 when
  every job succeeded, 1 when one did not or was never submitted, 130 after Ctrl-C (the jobs still running).
- ``cancel`` cancels the jobs that have not ended, and names each one.
- ``logs`` prints job N's output (its first 1000 lines, from Cloud Logging).

A folder that is not a sweep's is one line and exit status 2; a call Vertex AI or Cloud Storage refuses
(or that cannot reach them) is one line with the fix, and exit status 1.

The calls are the launcher's own (hydra_plugins.vertex_launcher: its client, with its retries and its
messages; its rows; its log reader), imported when a command runs: it needs the ``vertex`` extra.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import shutil
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from nli.errors import StorageError, UserError, google_client_missing
from nli.io.storage import Storage
from nli.sweep import table as sweep

if TYPE_CHECKING:
    from hydra_plugins.vertex_launcher._client import Vertex
    from hydra_plugins.vertex_launcher._core import Job
    from hydra_plugins.vertex_launcher._logs import JobLogs

log = logging.getLogger(__name__)

DETACHED = 130  # Ctrl-C: the shell's status for a command stopped by SIGINT; the jobs themselves go on
LOG_LINES = 1000  # lines `logs` prints (Cloud Logging's page)


class NotASweep(UserError):
    """A folder without the record of a Vertex AI sweep's jobs."""


@dataclass
class Attached:
    """A sweep found again: its record, its jobs, where its table is, and the launcher's calls."""

    where: str  # SWEEP as given
    record: Dict[str, Any]
    jobs: List["Job"]
    table: "Table"
    vertex: "Vertex"
    logs: "JobLogs"
    never_submitted: List[Dict[str, Any]]  # jobs of the sweep its launcher stopped before submitting

    def job(self, num: int) -> "Job":
        for job in self.jobs:
            if job.num == num:
                return job
        known = ", ".join(str(job.num) for job in self.jobs)
        raise NotASweep(f"{self.where} has no job {num}: its jobs are {known}")


class Table:
    """The sweep's table (nli.sweep.table): in its local folder, or, for a sweep in a bucket, kept beside the
    bucket's folder in a local working copy that is uploaded each time a row is added."""

    def __init__(self, where: str) -> None:
        self.remote = Storage(where, key="SWEEP") if "://" in where else None
        self.dir = Path(tempfile.mkdtemp(prefix="nli-cloud-")) if self.remote else Path(where)
        if self.remote is not None:
            weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)
        if self.remote is not None and self.remote.exists(sweep.RESULTS_JSONL):
            (self.dir / sweep.RESULTS_JSONL).write_bytes(self.remote.read_bytes(sweep.RESULTS_JSONL))

    def rows(self, sweep_id: Optional[str]) -> List[Dict[str, Any]]:
        return sweep.of_sweep(sweep.read_rows(self.dir), sweep_id)

    def record(self, row: Dict[str, Any]) -> None:
        sweep.record(self.dir, row)
        if self.remote is not None:
            for name in (sweep.RESULTS_JSONL, sweep.RESULTS_CSV):
                self.remote.write_bytes(name, (self.dir / name).read_bytes())

    def where(self) -> str:
        return self.remote.url if self.remote is not None else str(self.dir)


# ------------------------------------------------------------------------------- finding the sweep


def find(where: str) -> Attached:
    """The sweep whose folder (local or gs://) is ``where``, with the launcher's client on its region."""
    try:
        from omegaconf import OmegaConf

        from hydra_plugins.vertex_launcher._client import Vertex
        from hydra_plugins.vertex_launcher._core import Job
        from hydra_plugins.vertex_launcher._logs import JobLogs
        from hydra_plugins.vertex_launcher._record import JOBS_FILE, read
        from hydra_plugins.vertex_launcher.config import VertexLauncherConf
    except ImportError as error:
        if not google_client_missing(error):
            raise
        raise UserError(f"python -m nli.cloud needs Google's Vertex AI client ({error}): pip install "
                        "'nli-glue[vertex]' (or -e '.[vertex]' in a checkout)") from None
    where = where.rstrip("/")
    record = _read(where, read, JOBS_FILE)
    settings = VertexLauncherConf(project=record["project"], region=record["region"],
                                  api_endpoint=record.get("api_endpoint"))
    vertex = Vertex(settings)
    found, never_submitted = _submitted(record, vertex)
    jobs = [Job(int(each["num"]), list(each["overrides"]), OmegaConf.create({}), Path(each["output_dir"]),
                each["remote_dir"], name=each["name"]) for each in found]
    started = (record.get("stamp") or {}).get(sweep.SWEEP_STARTED)  # its jobs' output is from then on
    since = datetime.fromtimestamp(float(started), timezone.utc) if started else None
    return Attached(where, record, jobs, Table(where), vertex, JobLogs(settings, since=since), never_submitted)


def _submitted(record: Dict[str, Any], vertex: "Vertex") -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """The record's jobs, with those its launcher submitted but stopped before noting (found on Vertex AI
    by the sweep's label), and the jobs it planned and never submitted."""
    from hydra_plugins.vertex_launcher._record import SWEEP_LABEL, unsubmitted
    from hydra_plugins.vertex_launcher._spec import label_value

    jobs, never = list(record["jobs"]), []
    sweep_id = (record.get("stamp") or {}).get(sweep.SWEEP_ID)
    for each in unsubmitted(record):
        names = vertex.named({SWEEP_LABEL: label_value(sweep_id), "hydra_job": str(each["num"])}) if sweep_id else []
        if names:
            jobs.append({**each, "name": names[0]})
        else:
            never.append(each)
    return sorted(jobs, key=lambda each: each["num"]), never


def _read(where: str, read: Any, jobs_file: str) -> Dict[str, Any]:
    """The sweep's record, or a NotASweep that says what ``where`` is and what to give instead."""
    give = ("give the folder of a sweep launched with hydra/launcher=vertex: its hydra.sweep.dir, or its folder "
            "in the bucket, <staging_bucket>/<sweep name>")
    if "://" not in where and not Path(where).is_dir():
        raise NotASweep(f"{where}: no such folder; {give}")
    try:
        if "://" in where:
            Storage(where, key="SWEEP").check_readable()  # a wrong bucket or no network: at once, with the fix
        record = read(where)
    except StorageError as error:  # the bucket, the credentials or the network: its own message has the fix
        raise NotASweep(str(error)) from None
    except OSError as error:
        raise NotASweep(f"{where} cannot be read ({error}); check the URL and your credentials "
                        "(gcloud auth application-default login)") from None
    except ValueError as error:
        raise NotASweep(f"{where}/{jobs_file} is not the record a sweep writes ({error}); {give}") from None
    if record is None:
        other = (" (its jobs ran with another launcher, whose results are already in its table)"
                 if "://" not in where and (Path(where) / sweep.RESULTS_JSONL).is_file() else "")
        raise NotASweep(f"{where} is not a Vertex AI sweep's folder: it holds no {jobs_file}, which the launcher "
                        f"writes as it submits each job{other}; {give}")
    missing = _missing(record)
    if missing:
        raise NotASweep(f"{where}/{jobs_file} is not the record a sweep writes (no {missing}): it was edited or "
                        f"damaged; {give}")
    return dict(record)


def _missing(record: Any) -> Optional[str]:
    """The first field a sweep's record lacks, named; None for a whole record."""
    if not isinstance(record, dict):
        return "object at its top"
    for key in ("project", "region", "sweep_name", "jobs"):
        if key not in record:
            return repr(key)
    for job in [*record["jobs"], *record.get("planned", [])]:
        for key in ("num", "overrides", "remote_dir", "output_dir"):
            if not isinstance(job, dict) or key not in job:
                return f"{key!r} of a job"
    return next((repr("name") + " of a job" for job in record["jobs"] if "name" not in job), None)


# ---------------------------------------------------------------------------------- the commands


def attach(found: Attached, *, follow: Optional[int], interval: Optional[float]) -> int:
    """Polls the sweep's jobs until every one has ended, adding each one's row as it ends; the exit status."""
    from hydra_plugins.vertex_launcher._core import ENDED, ended

    stamp: Dict[str, Any] = dict(found.record.get("stamp") or {})
    done = {row["output_dir"] for row in found.table.rows(stamp.get(sweep.SWEEP_ID)) if row.get("vertex_job")}
    pause = float(interval if interval is not None else found.record.get("poll_interval") or 30.0)
    followed = found.job(follow) if follow is not None else None
    print(f"Attached to {len(found.jobs)} jobs of sweep {found.record['sweep_name']} ({found.where}); Ctrl-C "
          "detaches and leaves them running", flush=True)
    try:
        while True:
            for job in found.jobs:
                if job.state not in ENDED and _poll(found, job) and job.state in ENDED:
                    row = ended(job, stamp)[0]
                    if row["output_dir"] not in done:
                        found.table.record(row)
                        done.add(row["output_dir"])
            if followed is not None:
                _print_lines(found, followed)
            if all(job.state in ENDED for job in found.jobs):
                break
            time.sleep(pause)
    except KeyboardInterrupt:
        running = sum(job.state not in ENDED for job in found.jobs)
        print(f"\nDetached: the {running} jobs still running go on (nothing was cancelled). Attach again with "
              f"python -m nli.cloud attach {found.where}, or cancel them with python -m nli.cloud cancel "
              f"{found.where}", flush=True)
        return DETACHED
    failed = _report(found, stamp.get(sweep.SWEEP_ID))
    _name_never_submitted(found)
    return 1 if failed or found.never_submitted else 0


def _name_never_submitted(found: Attached) -> None:
    """The jobs missing from the table because nothing ever submitted them, and how to run them."""
    if not found.never_submitted:
        return
    nums = ", ".join(f"#{each['num']}" for each in found.never_submitted)
    commands = "\n".join(f"  python train.py -m hydra/launcher=vertex {shlex.join(each['overrides'])}"
                          for each in found.never_submitted)
    print(f"{len(found.never_submitted)} of the sweep's jobs were never submitted ({nums}): its launcher stopped "
          f"before their turn, so they are not in the table. Run them with your launcher settings:\n{commands}",
          flush=True)


def _report(found: Attached, sweep_id: Optional[str]) -> List[Dict[str, Any]]:
    """The sweep's table at its end, as the sweep prints it (of a local sweep, with its summary over seeds);
    the failed jobs."""
    if found.table.remote is None:
        return sweep.report(found.table.dir, sweep_id)
    rows = found.table.rows(sweep_id)  # its working copy's folder is no place to send a reader
    print(f"Sweep results ({found.table.where()}/{sweep.RESULTS_CSV}):\n{sweep.format_rows(rows)}\n"
          f"The report: python -m nli.report {found.table.where()}", flush=True)
    return [dict(row) for row in sweep.failed(rows)]


def _poll(found: Attached, job: "Job") -> bool:
    """The job's state, asked of Vertex AI and printed where it changed; whether it did."""
    from google.cloud.aiplatform_v1 import JobState

    remote = found.vertex.get(job.name)
    state = JobState(remote.state)
    if state == job.state:
        return False
    job.state, job.error = state, remote.error.message
    print(f"{job.label}: {state.name} {found.vertex.console_url(job.name)}", flush=True)
    return True


def _print_lines(found: Attached, job: "Job") -> None:
    for line in found.logs.new_lines([job.name])[job.name]:
        print(f"#{job.num} | {line}", flush=True)


def cancel(found: Attached) -> int:
    """Cancels the jobs that have not ended; names each job cancelled, and those that had ended."""
    from hydra_plugins.vertex_launcher._checks import LaunchError
    from hydra_plugins.vertex_launcher._core import ENDED

    cancelled = 0
    for job in found.jobs:
        _poll(found, job)
        if job.state in ENDED:
            continue
        try:
            found.vertex.cancel(job.name)
        except LaunchError as error:  # one job's cancel refused (it ended meanwhile): the others are still cancelled
            print(f"could not cancel {job.label} ({job.name}): {error}", flush=True)
            continue
        cancelled += 1
        print(f"cancelled {job.label} ({job.name})", flush=True)
    print(f"{cancelled} of the sweep's {len(found.jobs)} jobs cancelled" if cancelled else
          f"nothing to cancel: the sweep's {len(found.jobs)} jobs have all ended", flush=True)
    return 0


def logs(found: Attached, num: int) -> int:
    job = found.job(num)
    lines = found.logs.new_lines([job.name])[job.name][:LOG_LINES]
    for line in lines:
        print(line, flush=True)
    if not lines:
        print(f"no output of job {job.label} ({job.name}) in Cloud Logging yet", file=sys.stderr, flush=True)
    return 0


# ---------------------------------------------------------------------------------- the command line


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nli.cloud", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    attach_parser = commands.add_parser("attach", help="follow the jobs and fill the sweep's table")
    attach_parser.add_argument("sweep", metavar="SWEEP", help="the sweep's folder, local or gs://")
    attach_parser.add_argument("--logs", type=int, metavar="N", help="print job N's output as it comes")
    attach_parser.add_argument("--interval", type=float, metavar="SECONDS",
                               help="seconds between polls (default: the sweep's hydra.launcher.poll_interval)")
    cancel_parser = commands.add_parser("cancel", help="cancel the jobs that have not ended")
    cancel_parser.add_argument("sweep", metavar="SWEEP", help="the sweep's folder, local or gs://")
    logs_parser = commands.add_parser("logs", help="print a job's output")
    logs_parser.add_argument("sweep", metavar="SWEEP", help="the sweep's folder, local or gs://")
    logs_parser.add_argument("--job", type=int, required=True, metavar="N", help="the job's number")
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:  # the table and the launcher's warnings, as the sweep prints them
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        found = find(args.sweep)
        if args.command == "attach":
            return attach(found, follow=args.logs, interval=args.interval)
        if args.command == "cancel":
            return cancel(found)
        return logs(found, args.job)
    except UserError as error:  # what was given: the message alone, and argparse's status for a bad argument
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        import requests

        from hydra_plugins.vertex_launcher._checks import LaunchError

        if isinstance(error, requests.ConnectionError):  # no network, or an endpoint nothing answers at
            print(f"error: cannot reach Vertex AI ({_said(error)}); check the network", file=sys.stderr)
            return 1
        if not isinstance(error, (LaunchError, OSError)):
            raise
        print(f"error: {error}", file=sys.stderr)  # Vertex AI's or Cloud Storage's message, with the fix
        return 1


def _said(error: BaseException) -> str:
    return " ".join(str(error).split())

