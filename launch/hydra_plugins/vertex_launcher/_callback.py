"""The part of the launcher that runs inside each Vertex AI job, as a Hydra callback the launcher
adds to the job's command line.

At start it reads the job's secrets from Secret Manager into the environment (the job's spec holds
only their names); at the end it writes the task function's return value, or its error, to
``job_return.json`` in the job's model directory (nli.contract), where the launcher collects it
for Hydra's JobReturn."""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from nli.contract import VERTEX_JOB_ID, VERTEX_MODEL_DIR
from nli.io.storage import Storage

from ._spec import JOB_RETURN_FILE, REPORTED_BY, SECRETS_VARIABLE

# Where Secret Manager is reached from an emulator, as STORAGE_EMULATOR_HOST does for Cloud Storage.
EMULATOR_VARIABLE = "SECRET_MANAGER_EMULATOR_HOST"


class VertexJobCallback(Callback):
    def __init__(self) -> None:
        self.errors = _LastError()
        self.reported = False

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        # An app may end with SystemExit (as train.py does for errors a user can fix), which skips
        # on_job_end: then the last error it logged is what the launcher reports.
        logging.getLogger().addHandler(self.errors)
        atexit.register(self._on_exit)
        references = json.loads(os.environ.get(SECRETS_VARIABLE) or "{}")
        try:
            os.environ.update(read_secrets(references))
        except Exception as error:  # the job cannot run; say why where the launcher looks
            logging.getLogger(__name__).error("reading the job's secrets failed: %s. The job's service account "
                                              "needs roles/secretmanager.secretAccessor on each secret", error)
            raise

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        record = {"status": job_return.status.name}
        if job_return.status is JobStatus.COMPLETED:
            record["return_value"] = _jsonable(job_return.return_value)
        else:
            error = job_return._return_value
            record["error"] = f"{type(error).__name__}: {error}"
        _report(record)
        self.reported = True

    def _on_exit(self) -> None:
        if not self.reported:
            _report({"status": "FAILED", "error": self.errors.message or "the job exited before its task returned"})


class _LastError(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.message = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()


def _report(record: dict[str, Any]) -> None:
    output = os.environ.get(VERTEX_MODEL_DIR)
    if not output:  # unset when the image runs by hand, outside Vertex AI: nobody to report to
        return
    storage = Storage(output, key=VERTEX_MODEL_DIR)
    # Stamped with the job's ID: an earlier job of the same sweep and number wrote to this folder too, and its
    # report is not this job's (the launcher reads one only of the job it follows: _core.ended).
    record = {**record, REPORTED_BY: os.environ.get(VERTEX_JOB_ID)}
    try:
        if storage.cloud:
            # Not through gcsfs: at exit its cached filesystem's session is closed already (its finalizer runs
            # before this callback's report when the job read gs:// after it started), and a new one would be
            # left open, a traceback of aiohttp's in the job's last lines. google-cloud-storage keeps none.
            storage.blob(JOB_RETURN_FILE).upload_from_string(json.dumps(record), content_type="application/json")
        else:
            storage.write_text(JOB_RETURN_FILE, json.dumps(record))
    except Exception as error:  # the job's own error, logged before, must stay its last words: one line
        print(f"error: could not write {storage.describe(JOB_RETURN_FILE)} (the launcher will not see what this "
              f"job returned): {type(error).__name__}: {error}", file=sys.stderr)


def read_secrets(references: dict[str, str]) -> dict[str, str]:
    """NAME -> the secret's value, read with the job's own credentials."""
    if not references:
        return {}
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.secretmanager import SecretManagerServiceClient

    emulator = os.environ.get(EMULATOR_VARIABLE)
    if emulator:
        client = SecretManagerServiceClient(credentials=AnonymousCredentials(), transport="rest",
                                            client_options=ClientOptions(api_endpoint=emulator))
    else:
        client = SecretManagerServiceClient()
    return {name: client.access_secret_version(name=version).payload.data.decode()
            for name, version in references.items()}


def _jsonable(value: Any) -> Any:
    """Numbers, strings and their lists and dicts as they are; anything else as its text."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)
