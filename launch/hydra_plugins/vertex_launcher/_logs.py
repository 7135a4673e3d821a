"""A job's own output, read back from Cloud Logging, where Vertex AI writes every replica's stdout and
stderr (resource ``ml_job``, label ``job_id``): the last lines of a failed job, and the jobs' logs
followed live (``stream_logs``), as ``gcloud ai custom-jobs stream-logs`` does for one job.

Following a sweep asks for every job's new lines in one call per poll (Cloud Logging allows a project
60 reads a minute), each job from its own last printed timestamp on: ``(job_id="1" AND timestamp>="t1")
OR (job_id="2" AND timestamp>="t2")``. A job's position never depends on which other jobs are asked
about (a job that ended drops out of the question), and a quiet job cannot hold a chatty one back
behind a page of lines already printed. Entries can share a timestamp, so a strict ``timestamp>``
could lose lines; the insertIds of those printed at a job's last timestamp keep any from being printed
twice. A line Cloud Logging receives after later lines of its job were printed is not shown (as with
``gcloud ai custom-jobs stream-logs``); the job's console link has it.

Reading logs is a help, never a condition: any error here (most often a missing permission) is
one line in the sweep's log, said once, and the sweep goes on.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Optional, Set

from .config import VertexLauncherConf

log = logging.getLogger(__name__)

ROLE = "roles/logging.viewer"  # reads a project's logs
# How far before the sweep started its jobs' lines are looked for: the local clock may run ahead of Google's.
CLOCK_SLACK = timedelta(minutes=5)
# Jobs asked about in one query: Cloud Logging takes filters of up to 20,000 characters, about 110 per job here.
JOBS_PER_QUERY = 100


class JobLogs:
    def __init__(self, settings: VertexLauncherConf, *, since: Optional[datetime] = None) -> None:
        """``since``: when the sweep started (attached to later, its jobs logged before this process began);
        by default now."""
        self.settings = settings
        self._client: Any = None
        self._failed = False  # said once why logs cannot be read; not tried again
        # stream_logs, per job name: the timestamp of its last entry printed, and the insertIds printed at that
        # timestamp, the only ones of its entries a later call can return again.
        self._seen: Dict[str, str] = {}
        self._printed: Dict[str, Set[str]] = {}
        self._start = _format((since or datetime.now(timezone.utc)) - CLOCK_SLACK)  # no job of the sweep logged before

    def last_lines(self, job_name: str, count: int) -> List[str]:
        """The job's last ``count`` lines of output, oldest first; none where they cannot be read."""
        entries = self._entries(_job_filter(job_name), descending=True, count=count)
        return [_text(entry) for entry in reversed(entries)]

    def new_lines(self, job_names: List[str]) -> Dict[str, List[str]]:
        """Each job's lines logged since the last call, oldest first; a line is never given twice."""
        found: Dict[str, List[str]] = {name: [] for name in job_names}
        for start in range(0, len(job_names), JOBS_PER_QUERY):
            ids = {name.rsplit("/", 1)[-1]: name for name in job_names[start:start + JOBS_PER_QUERY]}
            each = " OR ".join(f'(resource.labels.job_id="{job_id}" AND timestamp>="{self._since(name)}")'
                               for job_id, name in ids.items())
            oldest = min(self._since(name) for name in ids.values())  # bounds the scan, as each clause does its job
            query = f'resource.type="ml_job" AND timestamp>="{oldest}" AND ({each})'
            for entry in self._entries(query, descending=False, count=1000):
                name = ids.get(str((entry.resource.labels or {}).get("job_id", "")) if entry.resource else "")
                if name is not None and self._first_time(name, str(entry.insert_id), _timestamp(entry)):
                    found[name].append(_text(entry))
        return found

    def _since(self, name: str) -> str:
        return self._seen.get(name, self._start)

    def _first_time(self, name: str, insert_id: str, stamp: str) -> bool:
        """Whether this entry of the job is new, noting it as printed if so."""
        last = self._seen.get(name, "")
        if stamp < last or (stamp == last and insert_id in self._printed[name]):
            return False
        if stamp > last:
            self._seen[name], self._printed[name] = stamp, set()
        self._printed[name].add(insert_id)
        return True

    def _entries(self, query: str, *, descending: bool, count: int) -> List[Any]:
        if self._failed:
            return []
        from google.cloud.logging import DESCENDING

        try:
            client = self._client or self._connect()
            return list(client.list_entries(resource_names=[f"projects/{self.settings.project}"], filter_=query,
                                            order_by=DESCENDING if descending else None, max_results=count))
        except Exception as error:  # permission, quota, network: the sweep must not fail for a log
            self._failed = True
            log.warning("the jobs' logs cannot be read from Cloud Logging (%s). Grant %s on project %s to see a "
                        "failed job's last lines here; the console link of each job shows them", _short(error),
                        ROLE, self.settings.project)
            return []

    def _connect(self) -> Any:
        from google.cloud import logging as cloud_logging

        endpoint: Optional[str] = self.settings.api_endpoint
        if endpoint and endpoint.startswith("http://"):  # an emulator: no credentials, plain HTTP
            from google.auth.credentials import AnonymousCredentials

            self._client = cloud_logging.Client(project=self.settings.project, credentials=AnonymousCredentials(),
                                                _use_grpc=False, client_options={"api_endpoint": endpoint})
        else:
            self._client = cloud_logging.Client(project=self.settings.project)
        return self._client


def _job_filter(job_name: str) -> str:
    return f'resource.type="ml_job" AND resource.labels.job_id="{job_name.rsplit("/", 1)[-1]}"'


def _text(entry: Any) -> str:
    payload = entry.payload
    if isinstance(payload, dict):  # a structured entry: its message
        return str(payload.get("message", payload))
    return str(payload).rstrip("\n")


def _timestamp(entry: Any) -> str:
    return _format(entry.timestamp)


def _format(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _short(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
