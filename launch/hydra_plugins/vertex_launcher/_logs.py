"""A job's own output, read back from Cloud Logging, where Vertex AI writes every replica's stdout and
stderr (resource ``ml_job``, label ``job_id``): the last lines of a failed job, and a single job's
log followed live (``stream_logs``), as ``gcloud ai custom-jobs stream-logs`` does.

Reading logs is a help, never a condition: any error here (most often a missing permission) is
one line in the sweep's log, said once, and the sweep goes on.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional

from .config import VertexLauncherConf

log = logging.getLogger(__name__)

ROLE = "roles/logging.viewer"  # reads a project's logs


class JobLogs:
    def __init__(self, settings: VertexLauncherConf) -> None:
        self.settings = settings
        self._client: Any = None
        self._failed = False  # said once why logs cannot be read; not tried again
        self._seen: dict[str, str] = {}  # job name -> timestamp of the last entry printed (stream_logs)

    def last_lines(self, job_name: str, count: int) -> List[str]:
        """The job's last ``count`` lines of output, oldest first; none where they cannot be read."""
        entries = self._entries(_job_filter(job_name), descending=True, count=count)
        return [_text(entry) for entry in reversed(entries)]

    def new_lines(self, job_name: str) -> List[str]:
        """The job's lines logged since the last call (for a job being followed)."""
        since = self._seen.get(job_name)
        after = f' AND timestamp>"{since}"' if since else ""
        entries = self._entries(_job_filter(job_name) + after, descending=False, count=1000)
        if entries:
            self._seen[job_name] = _timestamp(entries[-1])
        return [_text(entry) for entry in entries]

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
    return entry.timestamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _short(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
