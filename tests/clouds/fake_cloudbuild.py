"""An in-process fake of Cloud Build's v1 REST API, served beside the fake Vertex AI (tests/clouds/fake_vertex.py,
``FakeVertex.mount``) so that one ``api_endpoint`` reaches both, for the real ``google-cloud-build`` client.

It does what the service does where the launcher can tell: ``builds.create`` takes a Build (cloudbuild.yaml as
JSON), checks its substitutions as the service does, stores it QUEUED and answers a long-running Operation whose
metadata is the build; the build then goes WORKING and ends SUCCESS or FAILURE, and ``operations.get``,
``builds.get``, ``builds.list`` (``key="value"`` filters on tags, status, images, joined by AND) and
``builds.cancel`` answer for it. A build fetches its source (a gs:// tarball, from the Cloud Storage emulator),
reads the Dockerfile its docker step names, and fails as ``docker build`` would where a COPY names a file the
context lacks, or where a test said so with ``fail_next``. Its log is written, as Cloud Build writes it, to
``<logsBucket>/log-<id>.txt`` and named by ``logUrl``. A successful build pushes its images into the fake
Vertex's registry, runnable there as their Dockerfile's ENTRYPOINT in the unpacked context (which stands in for
the image's WORKDIR, the layout tests/project/test_docker.py checks), with the context's code first on PYTHONPATH.

Simplifications: no step runs (the docker step is read, not executed); one page per list.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.devtools.cloudbuild_v1 import Build
from google.protobuf.json_format import ParseError

from tests.clouds.fake_vertex import ApiError, FakeVertex, Reply

METADATA_TYPE = "type.googleapis.com/google.devtools.cloudbuild.v1.BuildOperationMetadata"
BUILD_TYPE = "type.googleapis.com/google.devtools.cloudbuild.v1.Build"
PARENT = r"projects/(?P<project>[^/]+)(?:/locations/(?P<location>[^/]+))?"
ROUTES = (
    ("POST", re.compile(rf"/v1/{PARENT}/builds"), "create"),
    ("GET", re.compile(rf"/v1/{PARENT}/builds"), "list"),
    ("GET", re.compile(rf"/v1/{PARENT}/builds/(?P<id>[^/:]+)"), "get"),
    ("POST", re.compile(rf"/v1/{PARENT}/builds/(?P<id>[^/:]+):cancel"), "cancel"),
    ("GET", re.compile(r"/v1/(?P<name>(?:projects/[^/]+/locations/[^/]+/)?operations/[^/:]+)"), "operation"),
)
SUBSTITUTION = re.compile(r"\$\{(?P<braced>[A-Z_][A-Z0-9_]*)\}|\$(?P<bare>[A-Z_][A-Z0-9_]*)")
FILTER_TERM = re.compile(r'\s*(?P<key>tags|status|images|build_id)\s*=\s*"(?P<value>[^"]*)"\s*')
ENDED = {Build.Status.SUCCESS, Build.Status.FAILURE, Build.Status.CANCELLED, Build.Status.TIMEOUT}
STEP_ERROR = 'ERROR: build step 0 "{name}" failed: step exited with non-zero status: 1'


@dataclass
class FakeBuild:
    build: Build
    operation: str
    context: Optional[Path] = None  # the unpacked source, once fetched
    stop: threading.Event = field(default_factory=threading.Event, repr=False)


class FakeCloudBuild:
    """Cloud Build on the fake Vertex's endpoint. ``builds`` holds every build created, in order."""

    def __init__(self, vertex: FakeVertex, *, project_number: str = "123456789", queued_seconds: float = 0.1,
                 working_seconds: float = 0.1) -> None:
        self.vertex = vertex
        self.project_number = project_number
        self.builds: Dict[str, FakeBuild] = {}
        self.logs_bucket = f"{project_number}-cloudbuild-logs"
        self._queued = queued_seconds
        self.working_seconds = working_seconds  # how long a build created from now on works
        self._failures: List[List[str]] = []
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._workspace = Path(tempfile.mkdtemp(prefix="fake-cloudbuild-"))
        self._threads: List[threading.Thread] = []
        self._storage = storage.Client(project="fake-cloudbuild", credentials=AnonymousCredentials())
        if self._storage.lookup_bucket(self.logs_bucket) is None:
            self._storage.create_bucket(self.logs_bucket)
        vertex.mount(self.handle)

    def fail_next(self, step_output: List[str]) -> None:
        """The next build's docker step prints ``step_output`` and exits 1."""
        with self._lock:
            self._failures.append(list(step_output))

    def log_of(self, build: Build) -> str:
        return self._storage.bucket(self.logs_bucket).blob(f"log-{build.id}.txt").download_as_text()

    def close(self) -> None:
        with self._lock:
            builds, threads = list(self.builds.values()), list(self._threads)
        for build in builds:
            build.stop.set()
        for thread in threads:
            thread.join(timeout=10)
        shutil.rmtree(self._workspace, ignore_errors=True)

    # ----- HTTP -----

    def handle(self, method: str, raw_path: str, body: bytes) -> Optional[Reply]:
        url = urlsplit(raw_path)
        path = unquote(url.path)
        found = [(route, match) for route_method, pattern, route in ROUTES
                 if route_method == method and (match := pattern.fullmatch(path)) is not None]
        if not found:
            return None
        route, match = found[0]
        handlers = {"create": self._create, "list": self._list, "get": self._get, "cancel": self._cancel,
                    "operation": self._operation}
        try:
            return 200, handlers[route](match.groupdict(), parse_qs(url.query), body)
        except ApiError as error:
            return error.reply()

    def _create(self, groups: Dict[str, Optional[str]], query: Dict[str, List[str]], body: bytes) -> dict:
        try:
            build = Build.from_json(body.decode() or "{}", ignore_unknown_fields=False)
        except ParseError as error:
            raise ApiError(400, "INVALID_ARGUMENT", f"Invalid JSON payload received. {error}") from error
        project, location = str(groups["project"]), groups["location"] or "global"
        if not build.steps:
            raise ApiError(400, "INVALID_ARGUMENT", "invalid build: no build steps")
        if not build.source.storage_source.bucket:
            raise ApiError(400, "INVALID_ARGUMENT", "invalid build: a source is required")
        with self._lock:
            build.id = str(uuid.UUID(int=next(self._ids)))
            build.project_id = project
            build.name = f"projects/{self.project_number}/locations/{location}/builds/{build.id}"
            _substitute(build, {"PROJECT_ID": project, "BUILD_ID": build.id, "LOCATION": location,
                                "PROJECT_NUMBER": self.project_number})
            build.status = Build.Status.QUEUED
            build.create_time = _now()
            build.logs_bucket = f"gs://{self.logs_bucket}"
            build.log_url = (f"https://console.cloud.google.com/cloud-build/builds;region={location}/{build.id}"
                             f"?project={self.project_number}")
            operation = f"projects/{self.project_number}/locations/{location}/operations/{uuid.uuid4()}"
            fake = FakeBuild(build, operation)
            self.builds[build.id] = fake
            thread = threading.Thread(target=self._run, args=(fake,), name=f"build-{build.id}", daemon=True)
            self._threads.append(thread)
            reply = self._operation_json(fake)
        thread.start()
        return reply

    def _get(self, groups: Dict[str, Optional[str]], query: Dict[str, List[str]], body: bytes) -> dict:
        with self._lock:
            return _json(self._build(str(groups["id"])).build)

    def _list(self, groups: Dict[str, Optional[str]], query: Dict[str, List[str]], body: bytes) -> dict:
        text = query.get("filter", [""])[0].strip()
        terms = [FILTER_TERM.fullmatch(term) for term in re.split(r"\s+AND\s+", text)] if text else []
        if not all(terms):
            raise ApiError(400, "INVALID_ARGUMENT", f"Invalid filter: {text!r}")
        wanted = [(m["key"], m["value"]) for m in terms if m is not None]
        with self._lock:
            found = [_json(b.build) for b in reversed(self.builds.values())  # newest first, as the service lists
                     if all(_has(b.build, key, value) for key, value in wanted)]
        size = int(query.get("pageSize", ["0"])[0] or 0)
        found = found[:size] if size else found
        return {"builds": found} if found else {}

    def _cancel(self, groups: Dict[str, Optional[str]], query: Dict[str, List[str]], body: bytes) -> dict:
        with self._lock:
            fake = self._build(str(groups["id"]))
            if fake.build.status in ENDED:
                raise ApiError(400, "FAILED_PRECONDITION", f"build {fake.build.id} is already finished")
            self._end(fake, Build.Status.CANCELLED, "Build cancelled by user")
            fake.stop.set()
            return _json(fake.build)

    def _operation(self, groups: Dict[str, Optional[str]], query: Dict[str, List[str]], body: bytes) -> dict:
        with self._lock:
            for fake in self.builds.values():
                if fake.operation == groups["name"]:
                    return self._operation_json(fake)
        raise ApiError(404, "NOT_FOUND", f"operation {groups['name']} not found")

    def _build(self, build_id: str) -> FakeBuild:
        if build_id not in self.builds:
            raise ApiError(404, "NOT_FOUND", f"build {build_id} not found")
        return self.builds[build_id]

    def _operation_json(self, fake: FakeBuild) -> dict:
        """A build's Operation: done once the build ended, with the Build, or the error a failed build gives."""
        reply: dict = {"name": fake.operation, "metadata": {"@type": METADATA_TYPE, "build": _json(fake.build)}}
        if fake.build.status in ENDED:
            reply["done"] = True
            if fake.build.status == Build.Status.SUCCESS:
                reply["response"] = {"@type": BUILD_TYPE, **_json(fake.build)}
            else:
                reply["error"] = {"code": 2, "message": f"Build failed; check build logs for details: "
                                                       f"{fake.build.log_url}"}
        return reply

    # ----- a build's life -----

    def _run(self, fake: FakeBuild) -> None:
        if fake.stop.wait(self._queued):
            return
        build = fake.build
        with self._lock:
            if build.status in ENDED:
                return
            build.status, build.start_time = Build.Status.WORKING, _now()
        log = [f'starting build "{build.id}"', "", "FETCHSOURCE"]
        source = build.source.storage_source
        log.append(f"Fetching storage object: gs://{source.bucket}/{source.object_}")
        try:
            fake.context = self._fetch(build.id, source.bucket, source.object_)
        except Exception as error:  # the object is not there, or not a tarball
            log.append(f"ERROR: failed to fetch source: {error}")
            return self._finish(fake, log, Build.Status.FAILURE, "FETCH_SOURCE_FAILED", str(error))
        step = build.steps[0]
        log += ["BUILD", "Starting Step #0", f"Step #0: Already have image (with digest): {step.name}"]
        output = self._step(fake.context, list(step.args))
        log += [f"Step #0: {line}" for line in output[0]]
        if fake.stop.wait(self.working_seconds):
            return
        if not output[1]:
            log += ["Finished Step #0", "ERROR", STEP_ERROR.format(name=step.name)]
            return self._finish(fake, log, Build.Status.FAILURE, "USER_BUILD_STEP",
                                f"Build step failure: {STEP_ERROR.format(name=step.name)[7:]}")
        log += ["Finished Step #0", "PUSH"]
        digests = {}
        for image in build.images:
            digests[image] = "sha256:" + hashlib.sha256(f"{build.id} {image}".encode()).hexdigest()
            log += [f"Pushing {image}", f"latest: digest: {digests[image]} size: 4321"]
            self._push(image, fake.context, digests[image])
        build.results.images = [{"name": image, "digest": digest} for image, digest in digests.items()]
        self._finish(fake, [*log, "DONE"], Build.Status.SUCCESS, None, "")

    def _fetch(self, build_id: str, bucket: str, name: str) -> Path:
        data = self._storage.bucket(bucket).blob(name).download_as_bytes()
        folder = self._workspace / build_id
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(folder, filter="data")
        return folder

    def _step(self, context: Path, args: List[str]) -> Tuple[List[str], bool]:
        """The docker step, read: its Dockerfile, and each COPY source in the context; (its output, whether it
        succeeded). A test's fail_next comes first."""
        with self._lock:
            if self._failures:
                return self._failures.pop(0), False
        dockerfile = next((arg.split("=", 1)[1] for arg in args if arg.startswith("--file=")), "Dockerfile")
        if not (context / dockerfile).is_file():
            return [f"unable to prepare context: unable to evaluate symlinks in Dockerfile path: lstat "
                    f"/workspace/{dockerfile}: no such file or directory"], False
        output = ["Sending build context to Docker daemon"]
        for line in (context / dockerfile).read_text().splitlines():
            words = line.split()
            if words[:1] == ["COPY"] and not any(word.startswith("--from=") for word in words):
                for source in [word for word in words[1:-1] if not word.startswith("--")]:
                    if not (context / source).exists():
                        output.append(f"COPY failed: file not found in build context or excluded by .dockerignore: "
                                      f"stat {source.rstrip('/')}: file does not exist")
                        return output, False
        return [*output, "Successfully built 0123456789ab"], True

    def _push(self, image: str, context: Path, digest: str) -> None:
        """Into the fake Vertex's registry: the image runs its Dockerfile's ENTRYPOINT in the context."""
        entrypoints = [line.split(None, 1)[1] for line in (context / "Dockerfile").read_text().splitlines()
                       if line.startswith("ENTRYPOINT ")]
        entrypoint = json.loads(entrypoints[-1])
        entrypoint = [sys.executable if entrypoint[0] == "python" else entrypoint[0], *entrypoint[1:]]
        self.vertex.add_image(image, entrypoint=entrypoint, workdir=context, digest=digest,
                              env={"PYTHONPATH": f"{context}:{context / 'launch'}"})

    def _finish(self, fake: FakeBuild, log: List[str], status: Build.Status, failure: Optional[str],
                detail: str) -> None:
        self._storage.bucket(self.logs_bucket).blob(f"log-{fake.build.id}.txt").upload_from_string(
            "\n".join(log) + "\n")
        with self._lock:
            if fake.build.status in ENDED:
                return
            if failure:
                fake.build.failure_info = {"type_": failure, "detail": detail}
                fake.build.status_detail = detail
            self._end(fake, status, detail)

    def _end(self, fake: FakeBuild, status: Build.Status, detail: str) -> None:
        fake.build.status = status
        fake.build.finish_time = _now()


def _substitute(build: Build, builtins: Dict[str, str]) -> None:
    """The service's substitution rules: each user substitution must be used, each one used must be given
    (or built in); with dynamicSubstitutions, values may use others. Applied to the steps and images."""
    values = dict(build.substitutions)
    template = [*(arg for step in build.steps for arg in [step.name, *step.args]), *build.images]
    used = {m["braced"] or m["bare"] for text in template for m in SUBSTITUTION.finditer(text)}
    for name in sorted(set(values) - used):
        raise ApiError(400, "INVALID_ARGUMENT",
                       f'generic::invalid_argument: key "{name}" in the substitution data is not matched in the '
                       "template")
    for name in sorted(used - set(values) - set(builtins)):
        raise ApiError(400, "INVALID_ARGUMENT",
                       f'generic::invalid_argument: key in the template "{name}" is not a valid built-in '
                       "substitution")
    if build.options.dynamic_substitutions:
        values = {name: _expand(value, builtins) for name, value in values.items()}
    everything = {**builtins, **values}
    for step in build.steps:
        step.name = _expand(step.name, everything)
        step.args = [_expand(arg, everything) for arg in step.args]
    build.images = [_expand(image, everything) for image in build.images]


def _expand(text: str, values: Dict[str, str]) -> str:
    return SUBSTITUTION.sub(lambda m: values.get(m["braced"] or m["bare"], m[0]), text)


def _has(build: Build, key: str, value: str) -> bool:
    if key == "tags":
        return value in build.tags
    if key == "images":
        return value in build.images
    if key == "status":
        return Build.Status(build.status).name == value
    return build.id == value


def _json(build: Build) -> dict:
    return json.loads(Build.to_json(build, use_integers_for_enums=True, always_print_fields_with_no_presence=False))


def _now() -> datetime:
    return datetime.now(timezone.utc)


def wait_for_build(fake: FakeCloudBuild, build_id: str, timeout: float = 30.0) -> Build:
    deadline = time.monotonic() + timeout
    while fake.builds[build_id].build.status not in ENDED:
        if time.monotonic() > deadline:
            raise TimeoutError(f"build {build_id} did not end within {timeout} s")
        time.sleep(0.02)
    return fake.builds[build_id].build
