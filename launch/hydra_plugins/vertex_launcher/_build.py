"""The training image: built from the working tree with Cloud Build (``build=true``), or checked to
exist in Artifact Registry (``image_uri``), before any job is submitted.

A built image is tagged ``src-<digest>``, the digest of the Docker build context (_context), so the
tag names the content: an image with that tag in the repository was built from the same files and
settings, and is used again without a build. The check is Artifact Registry's get-tag, one small
call. A build runs the project's own ``cloudbuild.yaml`` (as ``gcloud builds submit --config
cloudbuild.yaml`` would) on the context, uploaded to the staging bucket as a tarball.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, TypeVar

import fsspec
import yaml
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import DefaultCredentialsError

from nli.errors import UserError
from nli.io.storage import Storage

from . import _context
from ._checks import LaunchError
from ._client import RETRY
from .config import VertexLauncherConf

log = logging.getLogger(__name__)

T = TypeVar("T")
BUILD_CONFIG = "cloudbuild.yaml"
# REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE[:TAG][@sha256:DIGEST]: an Artifact Registry image.
ARTIFACT_IMAGE = re.compile(r"(?P<location>[a-z0-9-]+)-docker\.pkg\.dev/(?P<project>[^/]+)/(?P<repository>[^/]+)/"
                            r"(?P<image>[^:@]+)(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?")
ENDED = {"SUCCESS", "FAILURE", "INTERNAL_ERROR", "TIMEOUT", "CANCELLED", "EXPIRED"}
# The substitutions the launcher sets in cloudbuild.yaml: the image it builds.
OWN_SUBSTITUTIONS = ("_IMAGE", "_TAG")


@dataclass(frozen=True)
class Image:
    uri: str  # what the jobs run: REPOSITORY:TAG as given or built
    digest: Optional[str]  # sha256:... of the manifest, where the registry said; None: not known

    def text(self) -> str:
        return f"{self.uri}@{self.digest}" if self.digest else self.uri


def default_repository(settings: VertexLauncherConf) -> str:
    """cloudbuild.yaml's own default, in the jobs' region: REGION-docker.pkg.dev/PROJECT/nli/train."""
    return f"{settings.region}-docker.pkg.dev/{settings.project}/nli/train"


def repository(settings: VertexLauncherConf) -> str:
    return (settings.build_repository or default_repository(settings)).rstrip("/")


class Registry:
    """Artifact Registry's read calls: does an image (its tag or digest) exist, and its digest."""

    def __init__(self, settings: VertexLauncherConf) -> None:
        from google.cloud.artifactregistry_v1 import ArtifactRegistryClient

        self.settings = settings
        self.client = _connect(ArtifactRegistryClient, settings, "artifactregistry.googleapis.com")

    def digest(self, uri: str) -> Optional[str]:
        """The image's digest; None if the registry has no such image. Other errors are the caller's."""
        match = ARTIFACT_IMAGE.fullmatch(uri)
        if match is None:
            raise ValueError(f"not an Artifact Registry image: {uri}")
        package = (f"projects/{match['project']}/locations/{match['location']}/repositories/{match['repository']}/"
                   f"packages/{match['image'].replace('/', '%2F')}")
        try:
            if match["digest"]:
                return str(self.client.get_version(name=f"{package}/versions/{match['digest']}", retry=RETRY)
                           .name.rsplit("/", 1)[-1])
            tag = self.client.get_tag(name=f"{package}/tags/{match['tag'] or 'latest'}", retry=RETRY)
            return str(tag.version.rsplit("/", 1)[-1])
        except gexc.NotFound:
            return None


def check_image(settings: VertexLauncherConf) -> Image:
    """image_uri, refused before anything is submitted if Artifact Registry says it does not exist. An
    image elsewhere (gcr.io, Docker Hub) or one the registry will not show is not checked: the job's
    service account may still be able to pull it."""
    uri = str(settings.image_uri)
    if not ARTIFACT_IMAGE.fullmatch(uri):
        return Image(uri, None)
    try:
        found = Registry(settings).digest(uri)
    except (gexc.GoogleAPICallError, gexc.RetryError, LaunchError) as error:
        log.warning("could not check that %s exists (%s); submitting anyway", uri, _short(error))
        return Image(uri, None)
    if found is None:
        raise LaunchError(f"hydra.launcher.image_uri={uri} is not in Artifact Registry: push it first (docs/vertex.md, "
                          f"Set-up), check the name with `gcloud artifacts docker images list "
                          f"{uri.split('@')[0].rsplit(':', 1)[0].rsplit('/', 1)[0]} --include-tags`, or let the "
                          "launcher build it: hydra.launcher.build=true without image_uri")
    return Image(uri, found)


def image_of_source(settings: VertexLauncherConf, source: Path, staging: str) -> Image:
    """The image built from ``source``: the one in the registry if this content was built before, else
    built now with Cloud Build. Dry run: its name only, nothing checked or built."""
    config = _build_config(source)
    substitutions = _substitutions(settings)
    tag, files = _context.image_tag(source, _context.build_settings(substitutions))
    uri = f"{repository(settings)}:{tag}"
    if settings.dry_run:
        log.info("dry run: the jobs would run %s, built from %s (%d files); nothing built", uri, source, len(files))
        return Image(uri, None)
    registry = Registry(settings)
    try:
        found = registry.digest(uri)
    except gexc.GoogleAPICallError as error:
        raise LaunchError(_explain("Artifact Registry", error, settings)) from None
    if found:
        log.info("Image %s@%s was built from this content before: using it, nothing to build", uri, found)
        return Image(uri, found)
    cloud_build = CloudBuild(settings)
    build = cloud_build.running(uri, tag)  # before the upload: a queued build still reads its tarball
    if build is None:
        source_url = f"{staging.rstrip('/')}/source/{tag}.tar.gz"
        _upload(_context.tarball(source, files), staging, f"source/{tag}.tar.gz")
        build = cloud_build.run(config, substitutions={**substitutions, "_IMAGE": repository(settings), "_TAG": tag},
                                source_url=source_url, tag=tag)
    built = [image.digest for image in build.results.images if image.name == uri] or [registry.digest(uri)]
    if not built[0]:
        raise LaunchError(f"Cloud Build {build.id} succeeded but pushed no {uri} (its images: "
                          f"{', '.join(image.name for image in build.results.images) or 'none'}): check "
                          f"{BUILD_CONFIG}'s images against hydra.launcher.build_repository; nothing was submitted")
    return Image(uri, built[0])


def _build_config(source: Path) -> Dict[str, Any]:
    path = source / BUILD_CONFIG
    if not (source / _context.DOCKERFILE).is_file() or not path.is_file():
        raise LaunchError(f"hydra.launcher.build=true builds {source} with its Dockerfile and {BUILD_CONFIG}, and "
                          "one of them is missing: point hydra.launcher.source_dir at the project")
    config = yaml.safe_load(path.read_text())
    if not isinstance(config, dict) or not config.get("steps"):
        raise LaunchError(f"{path} has no build steps: restore it from the project")
    return config


def _substitutions(settings: VertexLauncherConf) -> Dict[str, str]:
    return {name: str(value) for name, value in sorted(settings.build_substitutions.items())}


def _upload(data: bytes, staging: str, name: str) -> None:
    """The build context into the staging bucket, through the project's storage (its errors, one line each)."""
    try:
        Storage(staging, key="hydra.launcher.staging_bucket").write_bytes(name, data)
    except UserError as error:  # a missing bucket, no permission, no credentials
        raise LaunchError(f"hydra.launcher.staging_bucket={staging}: {error}. Create the bucket (gcloud storage "
                          "buckets create) or name one you can write to; nothing was built or submitted") from None
    log.info("Uploaded the build context (%.1f MB) to %s/%s", len(data) / 1e6, staging.rstrip("/"), name)


class CloudBuild:
    """One build of cloudbuild.yaml in the jobs' region, waited for."""

    def __init__(self, settings: VertexLauncherConf) -> None:
        from google.cloud.devtools.cloudbuild_v1 import CloudBuildClient

        self.settings = settings
        self.parent = f"projects/{settings.project}/locations/{settings.region}"
        self.client = _connect(CloudBuildClient, settings, "cloudbuild.googleapis.com")

    def run(self, config: Dict[str, Any], *, substitutions: Dict[str, str], source_url: str, tag: str) -> Any:
        """Creates the build and polls it to its end; a build that does not succeed is a LaunchError
        with the last lines of its log."""
        from google.cloud.devtools.cloudbuild_v1 import Build

        build = Build.from_json(json.dumps(config), ignore_unknown_fields=False)
        bucket, _, blob = source_url.removeprefix("gs://").partition("/")
        build.source = {"storage_source": {"bucket": bucket, "object_": blob}}
        build.substitutions = {**build.substitutions, **substitutions}
        build.tags = [*build.tags, "nli-train", tag]
        operation = self._call(lambda: self.client.create_build(
            request={"parent": self.parent, "build": build}, retry=RETRY))  # regional: parent, no project_id
        build = operation.metadata.build
        log.info("Cloud Build %s: building %s:%s, log at %s", build.id, substitutions["_IMAGE"], tag, build.log_url)
        return self._wait(f"{self.parent}/builds/{build.id}", build)

    def running(self, uri: str, tag: str) -> Any:
        """Another launch's build of this image (this content, into this repository), waited for to its end;
        None where none is queued or working."""
        builds = self._call(lambda: self.client.list_builds(
            request={"parent": self.parent, "filter": f'tags="{tag}"', "page_size": 10}, retry=RETRY))
        image, _, _ = uri.rpartition(":")
        found = next((build for build in builds.builds if build.status.name not in ENDED
                      and build.substitutions.get("_IMAGE") == image), None)
        if found is None:
            return None
        log.info("Cloud Build %s is building this content already (%s): waiting for it, not building again",
                 found.id, found.log_url)
        return self._wait(f"{self.parent}/builds/{found.id}", found)

    def _wait(self, name: str, build: Any) -> Any:
        status, interval = "", self.settings.poll_interval
        try:
            while True:
                if build.status.name != status:
                    status, interval = build.status.name, self.settings.poll_interval
                    log.info("Cloud Build %s: %s", build.id, status)
                if status in ENDED:
                    break
                time.sleep(interval)
                interval = min(interval * 1.5, self.settings.poll_interval * 10)
                build = self._call(lambda: self.client.get_build(request={"name": name}, retry=RETRY))
        except KeyboardInterrupt:
            # The build is left to finish: the next launch of this content uses its image, or waits for it.
            log.warning("Stopped waiting; nothing was submitted. Cloud Build %s goes on, and the next launch of this "
                        "content uses its image (or waits for it); to stop it: gcloud builds cancel %s --region=%s",
                        build.id, build.id, self.settings.region)
            raise SystemExit(130) from None
        if status != "SUCCESS":
            raise LaunchError(_failed(build, self.settings))
        return build

    def _call(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except gexc.GoogleAPICallError as error:
            raise LaunchError(_explain("Cloud Build", error, self.settings)) from None
        except gexc.RetryError as error:
            raise LaunchError(f"Cloud Build kept failing for 10 minutes: {error.cause}") from None


def _failed(build: Any, settings: VertexLauncherConf) -> str:
    """One line (what ended how, the fix), then the log's last lines."""
    detail = build.failure_info.detail or build.status_detail or "no detail given"
    fix = _FIXES.get(build.failure_info.type_.name) or _FIXES.get(build.status.name) or _FIXES["USER_BUILD_STEP"]
    fix = fix.format(repository=repository(settings), region=settings.region, project=settings.project)
    lines = _log_tail(build, settings.failed_log_lines)
    tail = "".join(f"\n    {line}" for line in lines) if lines else ""
    where = f"; its last {len(lines)} lines:" if lines else f"; its log: {build.log_url}"
    return (f"Cloud Build {build.id} ended {build.status.name} ({detail}): {fix}. Nothing was submitted; "
            f"log: {build.log_url}{where}{tail}")


_FIXES = {
    "USER_BUILD_STEP": "fix what its log shows (the Dockerfile, or what it installs) and launch again",
    "FETCH_SOURCE_FAILED": "Cloud Build could not read the uploaded source: give its service account "
                           "roles/storage.objectViewer on the staging bucket",
    "PUSH_FAILED": "create the repository of {repository} (gcloud artifacts repositories create REPOSITORY "
                   "--repository-format=docker --location={region}) or set hydra.launcher.build_repository",
    "PUSH_IMAGE_NOT_FOUND": "the build made no image {repository}:TAG: keep cloudbuild.yaml's --tag=${{_IMAGE}}:"
                            "${{_TAG}} and images list",
    "PUSH_NOT_AUTHORIZED": "give Cloud Build's service account roles/artifactregistry.writer on {repository}",
    "TIMEOUT": "raise `timeout` in cloudbuild.yaml",
    "CANCELLED": "someone cancelled it; launch again to build again",
    "EXPIRED": "it waited in the queue too long; launch again",
    "INTERNAL_ERROR": "Cloud Build failed on its side; launch again",
}


def _log_tail(build: Any, count: int) -> List[str]:
    """The last lines of the build's log, from its logs bucket (``log-<id>.txt``, as Cloud Build writes
    it); none where it cannot be read (the console link still shows it)."""
    if count <= 0 or not build.logs_bucket:
        return []
    try:
        with fsspec.open(f"{build.logs_bucket.rstrip('/')}/log-{build.id}.txt", "r") as stream:
            return [line.rstrip("\n") for line in stream.read().splitlines()[-count:]]
    except Exception as error:  # permission, missing object, network: the link is enough
        log.warning("could not read the build's log from %s: %s", build.logs_bucket, _short(error))
        return []


def _connect(client_class: Any, settings: VertexLauncherConf, host: str) -> Any:
    endpoint = settings.api_endpoint or host
    options = ClientOptions(api_endpoint=endpoint)
    try:
        if endpoint.startswith("http://"):  # an emulator: REST, no credentials
            return client_class(credentials=AnonymousCredentials(), transport="rest", client_options=options)
        return client_class(client_options=options)
    except DefaultCredentialsError as error:
        raise LaunchError(f"no Google Cloud credentials ({error}). Run `gcloud auth application-default "
                          "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service account key") from None


def _explain(service: str, error: gexc.GoogleAPICallError, settings: VertexLauncherConf) -> str:
    message = f"{service} refused the call: {error.code} {error.message}"
    text = str(error.message).lower()
    api = "cloudbuild.googleapis.com" if service == "Cloud Build" else "artifactregistry.googleapis.com"
    if "service_disabled" in text or "has not been used" in text or "is disabled" in text:
        return f"{message}\nEnable the API: gcloud services enable {api} --project={settings.project}"
    if isinstance(error, gexc.PermissionDenied):
        role = "roles/cloudbuild.builds.editor" if service == "Cloud Build" else "roles/artifactregistry.reader"
        return f"{message}\nYour account needs {role} on {settings.project}"
    return message


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
