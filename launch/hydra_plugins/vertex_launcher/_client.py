"""The Vertex AI JobService client: transient errors retried with backoff, the others turned into
one message that says what the API said and, where it is known, how to fix it."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, TypeVar

from google.api_core import exceptions as gexc
from google.api_core import retry as gretry
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import DefaultCredentialsError
from google.cloud.aiplatform_v1 import CustomJob, JobServiceClient

from ._checks import LaunchError
from ._record import SWEEP_LABEL
from .config import VertexLauncherConf

T = TypeVar("T")


def _transient(error: Exception) -> bool:
    """Worth another try: the service is busy or the call timed out. A 429 about quota is not
    transient (it stays until the quota grows); a 429 about request rate is."""
    if isinstance(error, (gexc.TooManyRequests, gexc.ResourceExhausted)):
        return "quota" not in str(error).lower()
    # DeadlineExceeded is a GatewayTimeout: a 504 over REST comes as the latter.
    return isinstance(error, (gexc.ServiceUnavailable, gexc.GatewayTimeout, gexc.BadGateway,
                              gexc.InternalServerError))


def _rate_limited(error: Exception) -> bool:
    """Refused for the rate of calls, before the service did anything: a retry cannot make a job twice."""
    return isinstance(error, (gexc.TooManyRequests, gexc.ResourceExhausted))


RETRY = gretry.Retry(predicate=_transient, initial=0.5, maximum=30.0, multiplier=2.0, timeout=600.0)
# The labels that tell one submission of a sweep's job from any other (a sweep run again under its name included).
IDENTITY = (SWEEP_LABEL, "hydra_job")


class Vertex:
    """The calls the launcher makes, on one region's endpoint."""

    def __init__(self, settings: VertexLauncherConf) -> None:
        self.settings = settings
        self.parent = f"projects/{settings.project}/locations/{settings.region}"
        endpoint = settings.api_endpoint or f"{settings.region}-aiplatform.googleapis.com"
        options = ClientOptions(api_endpoint=endpoint)
        try:
            if endpoint.startswith("http://"):  # an emulator, as google-cloud-storage's STORAGE_EMULATOR_HOST
                self.client = JobServiceClient(credentials=AnonymousCredentials(), transport="rest",
                                               client_options=options)
            else:
                self.client = JobServiceClient(client_options=options)
        except DefaultCredentialsError as error:
            raise LaunchError(f"no Google Cloud credentials ({error}). Run `gcloud auth application-default "
                              "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service account key") from None

    def create(self, job: Dict[str, Any]) -> CustomJob:
        """Create is not idempotent: a call that failed after the service made the job (a 5xx, a timeout on the
        way back) would, simply retried, make it twice, one running unfollowed. After such a failure the job
        is looked for by its labels (IDENTITY) and adopted if it exists, else created again."""
        waits = gretry.exponential_sleep_generator(initial=0.5, maximum=30.0, multiplier=2.0)
        deadline = time.monotonic() + 600.0
        while True:
            try:
                # proto-plus takes a dict for any message argument; the annotations name only the message class.
                return self.client.create_custom_job(parent=self.parent, custom_job=job,  # type: ignore[arg-type]
                                                     retry=None)
            except gexc.GoogleAPICallError as error:
                if not _transient(error):
                    raise LaunchError(explain(error, self.settings)) from None
                if time.monotonic() > deadline:
                    raise LaunchError(f"Vertex AI kept failing for 10 minutes: {error}") from None
                made = None if _rate_limited(error) else self._made_anyway(job, error)
                if made is not None:
                    return made
                time.sleep(next(waits))

    def _made_anyway(self, job: Dict[str, Any], error: gexc.GoogleAPICallError) -> Optional[CustomJob]:
        """The job a create that failed with ``error`` made all the same, if any."""
        identity = {key: job.get("labels", {}).get(key) for key in IDENTITY}
        if None in identity.values():
            raise LaunchError(f"{explain(error, self.settings)}\nThe job may have been made all the same, and has no "
                              f"labels to find it by: gcloud ai custom-jobs list --region={self.settings.region}")
        made = self._labelled(identity)
        return made[0] if made else None

    def _labelled(self, labels: Dict[str, Any]) -> List[CustomJob]:
        query = " AND ".join(f'labels.{key}="{value}"' for key, value in labels.items())
        return self._call(lambda: list(self.client.list_custom_jobs(
            request={"parent": self.parent, "filter": query}, retry=RETRY)))

    def get(self, name: str) -> CustomJob:
        return self._call(lambda: self.client.get_custom_job(name=name, retry=RETRY))

    def named(self, labels: Dict[str, str]) -> List[str]:
        """The resource names of the jobs in this region that carry every one of ``labels``."""
        return [job.name for job in self._labelled(labels)]

    def cancel(self, name: str) -> None:
        self._call(lambda: self.client.cancel_custom_job(name=name, retry=RETRY))

    def console_url(self, name: str) -> str:
        job_id = name.rsplit("/", 1)[-1]
        return (f"https://console.cloud.google.com/vertex-ai/locations/{self.settings.region}/training/"
                f"{job_id}/cpu?project={self.settings.project}")

    def _call(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except gexc.GoogleAPICallError as error:
            raise LaunchError(explain(error, self.settings)) from None
        except gexc.RetryError as error:
            raise LaunchError(f"Vertex AI kept failing for 10 minutes: {error.cause}") from None


def explain(error: gexc.GoogleAPICallError, settings: VertexLauncherConf) -> str:
    """The API's own message, and the fix where one is known."""
    message = f"Vertex AI refused the call: {error.code} {error.message}"
    text = str(error.message).lower()
    project = settings.project
    if isinstance(error, gexc.PermissionDenied) or error.code == 403:
        if "service_disabled" in text or "has not been used" in text or "is disabled" in text:
            return f"{message}\nEnable the API: gcloud services enable aiplatform.googleapis.com --project={project}"
        return (f"{message}\nYour account needs roles/aiplatform.user on {project}: gcloud projects "
                f"add-iam-policy-binding {project} --member=user:YOU@EXAMPLE.COM --role=roles/aiplatform.user "
                "(the jobs' service account needs roles/storage.objectAdmin on the staging bucket and "
                "roles/secretmanager.secretAccessor on the secrets)")
    if "quota" in text:
        return (f"{message}\nAsk for more quota (https://console.cloud.google.com/iam-admin/quotas?project={project}), "
                "use another region (hydra.launcher.region=...) or lower hydra.launcher.max_concurrent_jobs")
    if isinstance(error, gexc.Unauthorized) or error.code == 401:
        return f"{message}\nLog in again: gcloud auth application-default login"
    if isinstance(error, gexc.NotFound):
        return f"{message}\nCheck hydra.launcher.project={project} and hydra.launcher.region={settings.region}"
    if isinstance(error, gexc.BadRequest) or error.code == 400:
        return f"{message}\nCheck the hydra.launcher settings; hydra.launcher.dry_run=true writes the requests to read"
    return message
