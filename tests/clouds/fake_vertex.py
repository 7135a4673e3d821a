"""An in-process fake of Vertex AI's JobService (CustomJobs) and Secret Manager, spoken over their REST protocol.

Nothing in the test environment can reach Google Cloud, yet the Vertex launcher talks to it through the real
``google-cloud-aiplatform`` GAPIC client. Rather than mocking that client (which would test our assumptions about
it, not the client), this module serves the REST routes the client really calls, on 127.0.0.1, and behaves the way
the service does where the launcher can tell the difference:

* create validates the job as the service does and answers 400 INVALID_ARGUMENT with Vertex's
  "List of found errors" message and a ``google.rpc.BadRequest`` detail;
* each job goes PENDING, then RUNNING, and runs worker pool 0 (replica 0 only) as a local process, in a clean
  environment with the variables Vertex sets (AIP_*, CLOUD_ML_*, CLUSTER_SPEC), its output in one log file per job;
* it ends SUCCEEDED, FAILED (with Vertex's wording) or, after a cancel, CANCELLING then CANCELLED;
* Secret Manager's ``versions/{v}:access`` returns secrets added by the test;
* Cloud Logging's ``entries:list`` returns each job's output as log entries, one per line, as Vertex AI
  writes a replica's stdout and stderr (resource ``ml_job``, labels ``job_id`` and ``task_name``), whole
  lines only, as they are written; filters in Cloud Logging's query language (tests/support/logging_filter.py:
  comparisons on any field, AND, OR, NOT and parentheses) and both orders are understood;
* Artifact Registry's get-tag and get-version answer for the images added with ``add_image`` (the
  registry the jobs pull from), NOT_FOUND for any other;
* other services can be served on the same endpoint (``mount``), as tests/clouds/fake_cloudbuild.py is;
* any call can be made to fail with a chosen HTTP error, and every request is recorded for inspection.

Replies are printed by proto-plus from the real ``aiplatform_v1`` and ``secretmanager_v1`` types, so a field the
client cannot read would fail here first. Deliberate simplifications: resource names keep the project ID as sent
(the real service answers with the project number), list has a single page, and only ``=`` filters on
``display_name``, ``state`` and ``labels.KEY``, joined by AND, are understood.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

import google_crc32c
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.aiplatform_v1 import CustomJob, EnvVar, JobState, WorkerPoolSpec
from google.cloud.secretmanager_v1 import AccessSecretVersionResponse
from google.protobuf.json_format import ParseError

from tests.support import logging_filter

Violation = Tuple[str, str]  # (field path as Vertex names it, what is wrong with it)
Reply = Tuple[int, dict]  # (HTTP status, JSON body)

ENDED_STATES = frozenset({JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED})
FAILABLE_METHODS = frozenset({"create", "get", "list", "cancel", "access", "entries", "tag"})

# The machine types Vertex AI custom training offers (a realistic subset), so that a typo fails at submission.
MACHINE_TYPES = frozenset(
    [f"n1-standard-{n}" for n in (4, 8, 16, 32, 64, 96)]
    + [f"n1-highmem-{n}" for n in (2, 4, 8, 16, 32, 64, 96)]
    + [f"{family}-{n}g" for family in ("a2-highgpu", "a2-ultragpu", "a3-highgpu") for n in (1, 2, 4, 8)]
    + [f"g2-standard-{n}" for n in (4, 8, 12, 16, 24, 32, 48, 96)]
    + [f"e2-standard-{n}" for n in (4, 8, 16, 32)]
    + ["cloud-tpu"] + [f"ct5lp-hightpu-{n}t" for n in (1, 4, 8)]  # TPU v2/v3 (TPU Node) and v5e (TPU VMs)
)

PARENT = re.compile(r"projects/[^/]+/locations/[^/]+")
LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_VERSION = re.compile(r"(?P<secret>projects/[^/]+/secrets/[^/]+)/versions/(?P<version>[^/]+)")
FILTER_TERM = re.compile(r'\s*(?P<key>display_name|state|labels\.[a-z0-9_-]+)\s*=\s*"?(?P<value>[^"]*)"?\s*')

# The (HTTP method, path, route) of each REST call served; the paths are those of the v1 REST bindings.
ROUTES = (
    ("POST", re.compile(r"/v1/(?P<parent>.+)/customJobs"), "create"),
    ("GET", re.compile(r"/v1/(?P<parent>.+)/customJobs"), "list"),
    ("GET", re.compile(r"/v1/(?P<name>projects/[^/]+/locations/[^/]+/customJobs/[^/:]+)"), "get"),
    ("POST", re.compile(r"/v1/(?P<name>projects/[^/]+/locations/[^/]+/customJobs/[^/:]+):cancel"), "cancel"),
    ("GET", re.compile(r"/v1/(?P<name>projects/[^/]+/secrets/[^/]+/versions/[^/:]+):access"), "access"),
    ("POST", re.compile(r"/v2/entries:list"), "entries"),
    # Artifact Registry; a package's `/` comes %2F-encoded, and decoded here like the rest of the path.
    ("GET", re.compile(r"/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
                       r"/repositories/(?P<repository>[^/]+)/packages/(?P<package>.+)"
                       r"/(?P<kind>tags|versions)/(?P<ref>[^/]+)"), "tag"),
)

# A real job gets none of the submitter's variables; these few keep a local process (and its Python) working.
# What a replica keeps of the test's environment: the machine's basics, and the suite's kernel pin
# (tests/conftest.py: precision=auto is fp32 on every CPU), which a real machine of a job's would not have.
INHERITED_VARIABLES = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "PYTHONPATH", "ONEDNN_MAX_CPU_ISA")
CLUSTER_SPEC = json.dumps({"cluster": {"workerpool0": ["workerpool0-0:2222"]}, "environment": "cloud",
                           "task": {"type": "workerpool0", "index": 0}})
CANCELLED_ERROR = (1, "CANCELED")  # google.rpc.Code.CANCELLED, with the message Vertex gives
POLL_SECONDS = 0.02


class ApiError(Exception):
    """An error reply in Google's JSON error format; the REST client turns it into a GoogleAPICallError."""

    def __init__(self, status: int, reason: str, message: str, violations: Sequence[Violation] = ()) -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.violations = status, reason, message, violations

    def reply(self) -> Reply:
        error: dict = {"code": self.status, "message": self.message, "status": self.reason}
        if self.violations:
            error["details"] = [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                                 "fieldViolations": [{"field": f, "description": d} for f, d in self.violations]}]
        return self.status, {"error": error}


def invalid_argument(violations: Sequence[Violation]) -> ApiError:
    """Vertex's validation error: every violation found, numbered, tab-separated."""
    found = "".join(f"{i}.Field: {path}; Message: {text}\t" for i, (path, text) in enumerate(violations, 1))
    return ApiError(400, "INVALID_ARGUMENT", f"List of found errors:\t{found}", violations)


@dataclass(frozen=True)
class FakeImage:
    """What a container image contributes when Vertex runs it: its ENTRYPOINT, WORKDIR and ENV."""

    entrypoint: List[str]
    workdir: Path
    env: Dict[str, str]


# Prebuilt executor images of python package jobs are Google's and always pull; unless a test describes one with
# add_image, they add nothing to the job.
PREBUILT_EXECUTOR = FakeImage(entrypoint=[], workdir=Path("."), env={})


@dataclass
class FakeJob:
    """One CustomJob as the fake holds it: the stored resource and the local process standing in for its replica."""

    job: CustomJob
    log_path: Path
    process: Optional[subprocess.Popen] = None
    cancel_requested: bool = False
    env: Dict[str, str] = field(default_factory=dict)  # the environment the replica got, once it starts
    stop: threading.Event = field(default_factory=threading.Event, repr=False)  # set by cancel and by close

    @property
    def state(self) -> JobState:
        return JobState(self.job.state)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class _Server(ThreadingHTTPServer):
    fake: FakeVertex


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._answer()

    do_POST = do_DELETE = do_GET

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, payload = self.server.fake.handle(self.command, self.path, body)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Silent: the requests are in FakeVertex.requests, and stderr noise would bury test output."""


class FakeVertex:
    """Vertex AI JobService and Secret Manager on http://127.0.0.1:PORT, for the real REST clients.

    Point a client at it with ``client_options=ClientOptions(api_endpoint=fake.endpoint)``, anonymous credentials
    and ``transport="rest"``. Use it as a context manager; leaving it kills every job still running.
    """

    def __init__(self, *, log_dir: Path, job_env: Optional[Dict[str, str]] = None, pending_seconds: float = 0.2,
                 cancel_grace_seconds: float = 2.0) -> None:
        self.jobs: Dict[str, FakeJob] = {}
        self.requests: List[Tuple[str, str, Optional[dict]]] = []
        self.secret_accesses: List[str] = []
        self._log_dir = log_dir
        self.job_env = dict(job_env or {})
        self.lines_per_timestamp = 1  # Cloud Logging stamps in microseconds: lines written at once share one
        self._pending_seconds = pending_seconds
        self._grace_seconds = cancel_grace_seconds
        self._images: Dict[str, FakeImage] = {}
        self.registry: Dict[str, str] = {}  # image URI (REPOSITORY:TAG) -> its digest, as Artifact Registry has it
        self._mounted: List[Callable[[str, str, bytes], Optional[Reply]]] = []
        self._secrets: Dict[str, Dict[str, str]] = {}  # secret name -> version id -> value, in the order added
        self._failures: Dict[str, List[ApiError]] = {method: [] for method in FAILABLE_METHODS}
        self._ids = itertools.count(1_000_000_000_000_000_001)  # Vertex's job IDs are 19-digit numbers
        self._lock = threading.RLock()
        self._threads: List[threading.Thread] = []
        self._closing = False
        self._workspace = Path(tempfile.mkdtemp(prefix="fake-vertex-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        # A short poll interval: close() waits up to one interval for the serving loop to notice shutdown.
        threading.Thread(target=self._server.serve_forever, args=(POLL_SECONDS,), name="fake-vertex",
                         daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeVertex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every job still running (no grace: the test is over) and stop serving."""
        with self._lock:
            self._closing = True
            jobs, threads = list(self.jobs.values()), list(self._threads)
        for job in jobs:
            job.stop.set()
        for thread in threads:
            thread.join(timeout=10)
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._workspace, ignore_errors=True)

    # ----- what tests set up and inspect -----

    def add_image(self, uri: str, *, entrypoint: List[str], workdir: Path,
                  env: Optional[Dict[str, str]] = None, digest: Optional[str] = None) -> None:
        """Make ``uri`` pullable: its jobs run ``entrypoint`` (unless the spec gives a command) in ``workdir``;
        Artifact Registry lists it with ``digest`` (by default one made from the URI)."""
        self._images[uri] = FakeImage(list(entrypoint), Path(workdir), dict(env or {}))
        self.registry[uri] = digest or "sha256:" + hashlib.sha256(uri.encode()).hexdigest()

    def mount(self, handler: Callable[[str, str, bytes], Optional[Reply]]) -> None:
        """Serve another service here: ``handler(method, path, body)`` answers its routes, None for others."""
        self._mounted.append(handler)

    def add_secret(self, version: str, value: str) -> None:
        """Add ``projects/P/secrets/N/versions/V``; ``versions/latest`` then resolves to it."""
        match = SECRET_VERSION.fullmatch(version)
        if match is None or match["version"] == "latest":
            raise ValueError(f"not a secret version name: {version!r}")
        with self._lock:
            self._secrets.setdefault(match["secret"], {})[match["version"]] = value

    def fail_next(self, method: str, *, status: int, message: str, reason: str, times: int = 1) -> None:
        """Answer the next ``times`` calls of ``method`` (create, get, list, cancel, access) with this error."""
        if method not in FAILABLE_METHODS:
            raise ValueError(f"method must be one of {sorted(FAILABLE_METHODS)}, not {method!r}")
        with self._lock:
            self._failures[method].extend([ApiError(status, reason, message)] * times)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Poll ``predicate`` until it holds; it runs without the lock, so it may call the fake through a client."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout} s; jobs: {self._states()}")
            time.sleep(POLL_SECONDS)

    def _states(self) -> Dict[str, str]:
        with self._lock:
            return {name: job.state.name for name, job in self.jobs.items()}

    # ----- HTTP -----

    def handle(self, method: str, raw_path: str, body: bytes) -> Reply:
        """Answer one HTTP request: record it, apply any injected failure, then serve its route."""
        url = urlsplit(raw_path)
        with self._lock:
            self.requests.append((method, raw_path, _json_or_none(body)))
        try:
            for handler in self._mounted:
                reply = handler(method, raw_path, body)
                if reply is not None:
                    return reply
            route, groups = _route(method, unquote(url.path))
            self._take_failure(route)
            handlers = {"create": self._create, "get": self._get, "list": self._list, "cancel": self._cancel,
                        "access": self._access, "entries": self._entries, "tag": self._tag}
            return 200, handlers[route](groups, parse_qs(url.query), body)
        except ApiError as error:
            return error.reply()

    def _take_failure(self, route: str) -> None:
        with self._lock:
            if self._failures[route]:
                raise self._failures[route].pop(0)

    # ----- JobService -----

    def _create(self, groups: Dict[str, str], query: Dict[str, List[str]], body: bytes) -> dict:
        job = _parse_custom_job(body)
        violations = _job_violations(groups["parent"], job)
        if violations:
            raise invalid_argument(violations)
        with self._lock:
            job_id = next(self._ids)
            job.name = f"{groups['parent']}/customJobs/{job_id}"
            job.state = JobState.JOB_STATE_PENDING
            job.create_time = job.update_time = _now()
            fake_job = FakeJob(job=job, log_path=self._log_dir / f"{job_id}.log")
            self.jobs[job.name] = fake_job
            thread = threading.Thread(target=self._run_job, args=(fake_job,), name=f"job-{job_id}", daemon=True)
            self._threads.append(thread)
            reply = _job_json(job)
        thread.start()
        return reply

    def _get(self, groups: Dict[str, str], query: Dict[str, List[str]], body: bytes) -> dict:
        with self._lock:
            return _job_json(self._job(groups["name"]).job)

    def _list(self, groups: Dict[str, str], query: Dict[str, List[str]], body: bytes) -> dict:
        wanted = _parse_filter(query.get("filter", [""])[0])
        prefix = groups["parent"] + "/customJobs/"
        with self._lock:
            found = [_job_json(j.job) for name, j in self.jobs.items() if name.startswith(prefix) and wanted(j.job)]
        return {"customJobs": found} if found else {}

    def _cancel(self, groups: Dict[str, str], query: Dict[str, List[str]], body: bytes) -> dict:
        with self._lock:
            job = self._job(groups["name"])
            if job.state in ENDED_STATES:
                raise ApiError(400, "FAILED_PRECONDITION",
                               f"Cannot cancel CustomJob {job.job.name} because it is in state {job.state.name}.")
            job.cancel_requested = True
            self._set_state(job, JobState.JOB_STATE_CANCELLING)
            job.stop.set()  # under the lock, so that the job cannot go RUNNING after this (see _run_replica)
        return {}

    def _job(self, name: str) -> FakeJob:
        if name not in self.jobs:
            raise ApiError(404, "NOT_FOUND", "The CustomJob does not exist.")
        return self.jobs[name]

    # ----- Secret Manager -----

    def _access(self, groups: Dict[str, str], query: Dict[str, List[str]], body: bytes) -> dict:
        match = SECRET_VERSION.fullmatch(groups["name"])
        assert match is not None  # the route's pattern is narrower than SECRET_VERSION
        with self._lock:
            self.secret_accesses.append(groups["name"])
            versions = self._secrets.get(match["secret"], {})
            version = next(reversed(versions), None) if match["version"] == "latest" else match["version"]
            if version not in versions:
                raise ApiError(404, "NOT_FOUND", f"Secret Version [{groups['name']}] not found.")
            data = versions[version].encode()
        response = AccessSecretVersionResponse(name=f"{match['secret']}/versions/{version}",
                                               payload={"data": data, "data_crc32c": google_crc32c.value(data)})
        return json.loads(AccessSecretVersionResponse.to_json(response))

    # ----- Artifact Registry -----

    def _tag(self, groups: Dict[str, str], query: Dict[str, List[str]], body: bytes) -> dict:
        repository = "/".join([f"{groups['location']}-docker.pkg.dev", groups["project"], groups["repository"],
                               groups["package"]])
        package = (f"projects/{groups['project']}/locations/{groups['location']}/repositories/{groups['repository']}"
                   f"/packages/{groups['package'].replace('/', '%2F')}")
        with self._lock:
            digests = {uri.rpartition(":")[2]: digest for uri, digest in self.registry.items()
                       if uri.rpartition(":")[0] == repository}
        if groups["kind"] == "tags" and groups["ref"] in digests:
            return {"name": f"{package}/tags/{groups['ref']}",
                    "version": f"{package}/versions/{digests[groups['ref']]}"}
        if groups["kind"] == "versions" and groups["ref"] in digests.values():
            return {"name": f"{package}/versions/{groups['ref']}"}
        what = "Tag" if groups["kind"] == "tags" else "Version"
        raise ApiError(404, "NOT_FOUND", f'Requested entity was not found. {what} "{groups["ref"]}" of "{repository}"')

    # ----- Cloud Logging -----

    def _entries(self, groups: Dict[str, str], query: Dict[str, List[str]], body: bytes) -> dict:
        request = json.loads(body or b"{}")
        try:
            wanted = logging_filter.parse(request.get("filter", ""))
        except ValueError as error:
            raise ApiError(400, "INVALID_ARGUMENT", f"Unparseable filter: {error}") from error
        with self._lock:
            jobs = list(self.jobs.values())
        entries = [entry for job in jobs for entry in _log_entries(job, self.lines_per_timestamp)
                   if wanted(entry)]
        entries.sort(key=lambda entry: entry["timestamp"], reverse="desc" in request.get("orderBy", ""))
        entries = entries[:int(request.get("pageSize") or 1000)]
        return {"entries": entries} if entries else {}

    # ----- running a job -----

    def _run_job(self, job: FakeJob) -> None:
        """The job's life after create: pending, pull, run worker pool 0's replica, end."""
        state, error = self._run_replica(job)
        with self._lock:
            if error is not None:
                job.job.error = {"code": error[0], "message": error[1]}
            self._set_state(job, state)

    def _run_replica(self, job: FakeJob) -> Tuple[JobState, Optional[Tuple[int, str]]]:
        """Pending, pull, then the replica's processes in turn; the state and error the job ends with."""
        if job.stop.wait(self._pending_seconds):
            return JobState.JOB_STATE_CANCELLED, CANCELLED_ERROR
        pool = job.job.job_spec.worker_pool_specs[0]
        image = self._pull(pool)
        if image is None:
            return JobState.JOB_STATE_FAILED, (3, f"Unable to pull image {pool.container_spec.image_uri}: the image "
                                                  "could not be pulled; check that it exists and that the job's "
                                                  "service account may read it.")
        with self._lock:
            if job.stop.is_set():  # cancelled while pulling
                return JobState.JOB_STATE_CANCELLED, CANCELLED_ERROR
            self._set_state(job, JobState.JOB_STATE_RUNNING)
        workdir = self._workspace / job.job.name.rsplit("/", 1)[1]
        job.env = self._replica_env(job.job, pool, image, workdir)
        try:
            commands, cwd = self._commands(pool, image, workdir)
        except Exception as error:  # a package that cannot be fetched fails the replica, as on Vertex
            _append(job.log_path, f"Failed to download the python package: {error}\n")
            return JobState.JOB_STATE_FAILED, _exit_error(1, job.log_path)
        deadline = _deadline(job.job)
        for command in commands:
            outcome = self._run_process(job, command, cwd, deadline)
            if outcome is not None:
                return outcome
        return JobState.JOB_STATE_SUCCEEDED, None

    def _pull(self, pool: WorkerPoolSpec) -> Optional[FakeImage]:
        if "python_package_spec" in pool:
            return self._images.get(pool.python_package_spec.executor_image_uri, PREBUILT_EXECUTOR)
        return self._images.get(pool.container_spec.image_uri)

    def _commands(self, pool: WorkerPoolSpec, image: FakeImage, workdir: Path) -> Tuple[List[List[str]], Path]:
        """The processes the replica runs in turn, and their working directory."""
        if "container_spec" in pool:
            spec = pool.container_spec
            return [[*(spec.command or image.entrypoint), *spec.args]], image.workdir
        spec = pool.python_package_spec
        work = workdir / "work"
        work.mkdir(parents=True)
        installs = [[sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                     "--target", str(workdir / "site"), str(path)]
                    for path in _download(spec.package_uris, workdir / "packages")]
        return [*installs, [sys.executable, "-m", spec.python_module, *spec.args]], work

    def _replica_env(self, job: CustomJob, pool: WorkerPoolSpec, image: FakeImage, workdir: Path) -> Dict[str, str]:
        """The replica's environment: a clean base, the test's job_env, the image's, Vertex's, then the spec's."""
        env = {name: os.environ[name] for name in INHERITED_VARIABLES if name in os.environ}
        env.update(self.job_env)
        env.update(image.env)
        env.update(_vertex_variables(job))
        if "python_package_spec" in pool:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(workdir / "site"), env.get("PYTHONPATH")]))
        spec_env = pool.container_spec.env if "container_spec" in pool else pool.python_package_spec.env
        env.update({variable.name: variable.value for variable in spec_env})
        return env

    def _run_process(self, job: FakeJob, command: List[str], cwd: Path,
                     deadline: Optional[float]) -> Optional[Tuple[JobState, Tuple[int, str]]]:
        """Run one process of the replica; None if it exits 0, else the state and error the job ends with."""
        with open(job.log_path, "ab") as log:
            try:  # its own session, so that cancel reaches its children too, as stopping a container does
                process = subprocess.Popen(command, cwd=cwd, env=job.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
            except OSError as error:  # what a container runtime reports as exit status 127
                log.write(f"exec {command[:1]} failed: {error}\n".encode())
                return JobState.JOB_STATE_FAILED, _exit_error(127, job.log_path)
        job.process = process
        while process.poll() is None:
            if job.stop.wait(POLL_SECONDS):
                self._stop(process)
                return JobState.JOB_STATE_CANCELLED, CANCELLED_ERROR
            if deadline is not None and time.monotonic() > deadline:
                self._stop(process)
                timeout = job.job.job_spec.scheduling.timeout.total_seconds()
                return JobState.JOB_STATE_FAILED, (4, f"The job exceeded its timeout of {timeout:g}s "
                                                      "(job_spec.scheduling.timeout) and was stopped.")
        _kill_group(process.pid, signal.SIGKILL)  # the container is gone once its main process ends
        if job.stop.is_set():
            return JobState.JOB_STATE_CANCELLED, CANCELLED_ERROR
        return None if process.returncode == 0 else (JobState.JOB_STATE_FAILED, _exit_error(process.returncode,
                                                                                            job.log_path))

    def _stop(self, process: subprocess.Popen) -> None:
        """SIGTERM the replica's process group, then SIGKILL after the grace period (none once closing)."""
        _kill_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=0 if self._closing else self._grace_seconds)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(process.pid, signal.SIGKILL)
        process.wait()

    def _set_state(self, job: FakeJob, state: JobState) -> None:
        """Move the job to ``state`` with the timestamps Vertex keeps; the caller holds the lock."""
        now = _now()
        job.job.state = state
        job.job.update_time = now
        if state == JobState.JOB_STATE_RUNNING:
            job.job.start_time = now
        if state in ENDED_STATES:
            job.job.end_time = now


# ----- parsing and printing -----

def _route(method: str, path: str) -> Tuple[str, Dict[str, str]]:
    for route_method, pattern, route in ROUTES:
        match = pattern.fullmatch(path)
        if route_method == method and match is not None:
            return route, match.groupdict()
    raise ApiError(404, "NOT_FOUND", f"The requested URL {path} was not found on this server.")


def _json_or_none(body: bytes) -> Optional[dict]:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _parse_custom_job(body: bytes) -> CustomJob:
    """The request's CustomJob; unknown fields are an error, as on the service, worded the way Google words it."""
    try:
        job = CustomJob.from_json(body.decode() or "{}", ignore_unknown_fields=False)
    except (ParseError, UnicodeDecodeError) as error:
        unknown = re.search(r'has no field named "(\w+)" at "CustomJob\.?([^"]*)"', str(error))
        if unknown is None:
            raise ApiError(400, "INVALID_ARGUMENT", f"Invalid JSON payload received. {error}") from error
        where = ".".join(filter(None, ["custom_job", _snake_case(unknown[2])]))
        raise ApiError(400, "INVALID_ARGUMENT",
                       f"Invalid JSON payload received. Unknown name \"{unknown[1]}\" at '{where}': Cannot find field.",
                       [(where, f'Invalid JSON payload received. Unknown name "{unknown[1]}" at \'{where}\': '
                                "Cannot find field.")]) from error
    for output_only in ("start_time", "end_time", "error", "web_access_uris"):  # the service ignores these
        delattr(job, output_only)
    return job


def _snake_case(camel: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m[0].lower(), camel)


def _job_json(job: CustomJob) -> dict:
    # The client asks for enum-encoding=int; like the service, leave out fields at their defaults.
    return json.loads(CustomJob.to_json(job, use_integers_for_enums=True, always_print_fields_with_no_presence=False))


def _parse_filter(text: str) -> Callable[[CustomJob], bool]:
    """The list filter as a predicate; only ``key="value"`` terms joined by AND (see the module docstring)."""
    terms = [FILTER_TERM.fullmatch(term) for term in re.split(r"\s+AND\s+", text.strip())] if text.strip() else []
    if not all(terms):
        raise ApiError(400, "INVALID_ARGUMENT", f"Unsupported filter (the fake understands key=\"value\" AND ...): "
                                                f"{text!r}")
    wanted = [(m["key"], m["value"]) for m in terms if m is not None]
    return lambda job: all(_filter_field(job, key) == value for key, value in wanted)


def _filter_field(job: CustomJob, key: str) -> str:
    if key == "state":
        return JobState(job.state).name
    if key == "display_name":
        return job.display_name
    return job.labels.get(key.split(".", 1)[1], "")


# ----- validation, as the service does it on create -----

def _job_violations(parent: str, job: CustomJob) -> List[Violation]:
    violations: List[Violation] = []
    if not PARENT.fullmatch(parent):
        violations.append(("parent", f"Invalid parent {parent!r}: expected projects/PROJECT/locations/LOCATION."))
    if not job.display_name:
        violations.append(("display_name", "Required field is not set."))
    elif len(job.display_name) > 128:
        violations.append(("display_name", "Display name must be at most 128 characters long."))
    if not job.job_spec.worker_pool_specs:
        violations.append(("job_spec.worker_pool_specs", "Required field is not set."))
    for index, pool in enumerate(job.job_spec.worker_pool_specs):
        violations += _pool_violations(f"job_spec.worker_pool_specs[{index}]", pool)
    output = job.job_spec.base_output_directory.output_uri_prefix
    if output and not output.startswith("gs://"):
        violations.append(("job_spec.base_output_directory.output_uri_prefix",
                           f"Output URI prefix {output!r} must be a Cloud Storage URI (gs://)."))
    if job.job_spec.tensorboard and not job.job_spec.service_account:
        violations.append(("job_spec.service_account", "A service account is required when a TensorBoard is set "
                                                       "(job_spec.tensorboard)."))
    return violations + _label_violations(dict(job.labels))


def _pool_violations(prefix: str, pool: WorkerPoolSpec) -> List[Violation]:
    machine = pool.machine_spec
    violations: List[Violation] = []
    if not machine.machine_type:
        violations.append((f"{prefix}.machine_spec.machine_type", "Required field is not set."))
    elif machine.machine_type not in MACHINE_TYPES:
        violations.append((f"{prefix}.machine_spec.machine_type",
                           f'Machine type "{machine.machine_type}" is not supported.'))
    if bool(machine.accelerator_type) != (machine.accelerator_count > 0):
        violations.append((f"{prefix}.machine_spec.accelerator_type",
                           "Both `accelerator_type` and `accelerator_count` should be specified or none."))
    if pool.replica_count < 1:
        violations.append((f"{prefix}.replica_count", "Replica count must be at least 1."))
    return violations + _task_violations(prefix, pool)


def _task_violations(prefix: str, pool: WorkerPoolSpec) -> List[Violation]:
    """The container or python package the pool runs (JSON parsing already refuses both at once: a oneof)."""
    if "container_spec" in pool:
        spec = pool.container_spec
        missing = [] if spec.image_uri else [(f"{prefix}.container_spec.image_uri", "Required field is not set.")]
        return missing + _env_violations(f"{prefix}.container_spec.env", spec.env)
    if "python_package_spec" in pool:
        package = pool.python_package_spec
        path = f"{prefix}.python_package_spec"
        violations = [(f"{path}.{name}", "Required field is not set.")
                      for name in ("executor_image_uri", "python_module", "package_uris") if not getattr(package, name)]
        violations += [(f"{path}.package_uris[{i}]", f"Package URI {uri!r} must be a Cloud Storage URI (gs://).")
                       for i, uri in enumerate(package.package_uris) if not uri.startswith("gs://")]
        return violations + _env_violations(f"{path}.env", package.env)
    return [(prefix, "One of `container_spec` or `python_package_spec` must be set.")]


def _env_violations(prefix: str, env: Sequence[EnvVar]) -> List[Violation]:
    return [(f"{prefix}[{i}].name", f"Invalid environment variable name {variable.name!r}.")
            for i, variable in enumerate(env) if not ENV_NAME.fullmatch(variable.name)]


def _label_violations(labels: Dict[str, str]) -> List[Violation]:
    violations: List[Violation] = []
    if len(labels) > 64:
        violations.append(("labels", f"At most 64 labels are allowed, got {len(labels)}."))
    violations += [("labels", f"Label key {key!r} is invalid: it must start with a lowercase letter and contain only "
                              "lowercase letters, digits, '_' and '-', at most 63 characters.")
                   for key in labels if not LABEL_KEY.fullmatch(key)]
    violations += [("labels", f"Label value {value!r} of key {key!r} is invalid: it may contain only lowercase "
                              "letters, digits, '_' and '-', at most 63 characters.")
                   for key, value in labels.items() if not LABEL_VALUE.fullmatch(value)]
    return violations


# ----- the replica's world -----

def _vertex_variables(job: CustomJob) -> Dict[str, str]:
    """The variables Vertex sets in every replica of a CustomJob."""
    _, project, _, region, _, job_id = job.name.split("/")
    variables = {"CLOUD_ML_JOB_ID": job_id, "CLOUD_ML_PROJECT_ID": project, "CLOUD_ML_REGION": region,
                 "CLUSTER_SPEC": CLUSTER_SPEC}
    output = job.job_spec.base_output_directory.output_uri_prefix.rstrip("/")
    if output:
        variables.update(AIP_MODEL_DIR=f"{output}/model/", AIP_CHECKPOINT_DIR=f"{output}/checkpoints/",
                         AIP_TENSORBOARD_LOG_DIR=f"{output}/logs/")
    return variables


def _log_entries(job: FakeJob, per_timestamp: int = 1) -> List[dict]:
    """The job's output so far as Cloud Logging's entries: a whole line each, ``per_timestamp`` lines to each
    microsecond from its start."""
    if not job.job.start_time:
        return []
    _, project, _, _, _, job_id = job.job.name.split("/")
    start = job.job.start_time.timestamp()
    lines = job.log.split("\n")
    if lines[-1] == "" or job.state not in ENDED_STATES:  # a line still being written waits for its newline
        lines.pop()
    return [{"logName": f"projects/{project}/logs/workerpool0-0", "insertId": f"{job_id}-{i}",
             "resource": {"type": "ml_job", "labels": {"job_id": job_id, "project_id": project,
                                                        "task_name": "workerpool0-0"}},
             "timestamp": datetime.fromtimestamp(start + i // per_timestamp / 1e6,
                                                 timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
             "severity": "ERROR" if line.startswith(("Traceback", "error:")) else "INFO", "textPayload": line}
            for i, line in enumerate(lines)]


def _download(uris: Sequence[str], folder: Path) -> Iterator[Path]:
    """Fetch gs:// objects; google-cloud-storage goes to the emulator when STORAGE_EMULATOR_HOST is set."""
    folder.mkdir(parents=True, exist_ok=True)
    client = storage.Client(project="fake-vertex", credentials=AnonymousCredentials())
    for uri in uris:
        bucket, _, blob = uri.removeprefix("gs://").partition("/")
        path = folder / blob.rsplit("/", 1)[-1]
        client.bucket(bucket).blob(blob).download_to_filename(str(path))
        yield path


def _deadline(job: CustomJob) -> Optional[float]:
    timeout = job.job_spec.scheduling.timeout if "scheduling" in job.job_spec else None
    return time.monotonic() + timeout.total_seconds() if timeout else None


def _exit_error(status: int, log_path: Path) -> Tuple[int, str]:
    """Vertex's error for a replica that exits non-zero; a signal N shows as 128 + N, as from a container."""
    status = 128 - status if status < 0 else status
    return 3, (f"The replica workerpool0-0 exited with a non-zero status of {status}. To find out more about why "
               f"your job exited please check the logs: {log_path}")


def _kill_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # the whole group has already exited
        pass


def _append(path: Path, text: str) -> None:
    with open(path, "a") as log:
        log.write(text)


def _now() -> datetime:
    return datetime.now(timezone.utc)
