"""hydra.launcher.build=true: the training image built from the working tree with Cloud Build, tagged by
its content and built once per content, then the sweep submitted with it; what each job ran (image and
commit) recorded. Real train.py sweeps, through the real google-cloud-build, artifact-registry and
aiplatform clients, against the fake services (tests/clouds/fake_cloudbuild.py, tests/clouds/fake_vertex.py) and the
Cloud Storage emulator."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from docker.utils.build import PatternMatcher
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud.devtools.cloudbuild_v1 import Build, CloudBuildClient

from hydra_plugins.vertex_launcher import _context
from hydra_plugins.vertex_launcher._build import Image, image_of_source
from hydra_plugins.vertex_launcher._client import Vertex
from hydra_plugins.vertex_launcher.config import VertexLauncherConf
from tests.clouds.fake_cloudbuild import FakeCloudBuild
from tests.clouds.fake_vertex import FakeVertex
from tests.clouds.test_vertex import sweep_cli
from tests.support.runs import FAST, ROOT, run_app

PROJECT = "test-project"
BUCKET = "gs://test-bucket/sweeps"
REPOSITORY = "us-central1-docker.pkg.dev/test-project/nli/train"  # the default: cloudbuild.yaml's, in the region
# What the Dockerfile copies and cloudbuild.yaml builds: a checkout of the project, less what it leaves out.
PROJECT_FILES = ["Dockerfile", ".dockerignore", "cloudbuild.yaml", "pyproject.toml", "README.md", "train.py",
                 "conf", "nli", "launch", "requirements"]


@pytest.fixture(scope="module")
def services(gcs_emulator: Dict[str, str], tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[FakeVertex, FakeCloudBuild]]:
    job_env = {**gcs_emulator, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with FakeVertex(log_dir=tmp_path_factory.mktemp("job-logs"), job_env=job_env, pending_seconds=0.05) as vertex:
        cloud_build = FakeCloudBuild(vertex, queued_seconds=0.05, working_seconds=0.05)
        try:
            yield vertex, cloud_build
        finally:
            cloud_build.close()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout of the project, committed, that a test may change."""
    root = tmp_path / "project"
    for name in PROJECT_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            root.mkdir(exist_ok=True)
            shutil.copy(source, root / name)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit",
                                                  "-q", "-m", "the project"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    return root


def launch(vertex: FakeVertex, checkout: Path, sweep_dir: Path, *more: str) -> List[str]:
    return ["-m", "hydra/launcher=vertex", f"hydra.launcher.project={PROJECT}",
            f"hydra.launcher.staging_bucket={BUCKET}", f"hydra.launcher.api_endpoint={vertex.endpoint}",
            "hydra.launcher.poll_interval=0.1", "hydra.launcher.build=true", f"hydra.launcher.source_dir={checkout}",
            f"hydra.sweep.dir={sweep_dir}", "hw=cpu", *FAST, *more]


def created_jobs(vertex: FakeVertex, since: int) -> List[dict]:
    return [body for method, path, body in vertex.requests[since:]
            if method == "POST" and path.split("?")[0].endswith("/customJobs")]


def container(request: dict) -> dict:
    return request["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]


def rows(sweep_dir: Path) -> List[Dict[str, str]]:
    with open(sweep_dir / "sweep_results.csv") as stream:
        return list(csv.DictReader(stream))


def head(checkout: Path) -> str:
    return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def submit_only(vertex: FakeVertex, args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    """The sweep submitted without waiting for its jobs, which are then cancelled through the client."""
    before = set(vertex.jobs)
    proc = run_app([*args, "hydra.launcher.wait=false"], cwd=cwd)
    client = Vertex(VertexLauncherConf(project=PROJECT, api_endpoint=vertex.endpoint))
    for name in set(vertex.jobs) - before:
        client.cancel(name)
    return proc


@pytest.mark.process
def test_build_submits_the_built_image_builds_once_per_content_and_records_what_ran(
        services: tuple[FakeVertex, FakeCloudBuild], checkout: Path, tmp_path: Path) -> None:
    vertex, cloud_build = services
    builds, requests = len(cloud_build.builds), len(vertex.requests)
    first = run_app(launch(vertex, checkout, tmp_path / "first"), cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    (build,) = [fake.build for fake in list(cloud_build.builds.values())[builds:]]
    (job,) = created_jobs(vertex, requests)
    image = container(job)["imageUri"]
    tag = image.rsplit(":", 1)[1]
    assert image == f"{REPOSITORY}:{tag}" and tag.startswith("src-") and tag in build.tags
    assert build.status == Build.Status.SUCCESS and [i.name for i in build.results.images] == [image]
    assert build.substitutions["_TAG"] == tag and build.steps[0].name == "gcr.io/cloud-builders/docker"
    # The job ran the image built from the checkout (the fake runs its ENTRYPOINT in the uploaded context).
    (ran,) = [fake for fake in vertex.jobs.values() if fake.job.display_name == job["displayName"]]
    assert str(cloud_build.builds[build.id].context) in ran.env["PYTHONPATH"]
    digest = build.results.images[0].digest
    env = {variable["name"]: variable["value"] for variable in container(job)["env"]}
    commit = head(checkout)
    assert env == {"NLI_IMAGE_URI": f"{image}@{digest}", "NLI_GIT_COMMIT": commit, "NLI_GIT_DIRTY": "false"}
    assert job["labels"]["image_tag"] == tag and job["labels"]["git_commit"] == commit
    assert job["labels"]["git_dirty"] == "false"
    (row,) = rows(tmp_path / "first")
    assert row["state"] == "COMPLETED" and row["image"] == f"{image}@{digest}" and row["git_commit"] == commit
    assert row["git_dirty"] == "False"

    # The same content again: the image is in the registry, nothing is built. (This sweep and the next are
    # looked at in their requests only: submitted without waiting, and their jobs cancelled.)
    again = submit_only(vertex, launch(vertex, checkout, tmp_path / "again"), tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(cloud_build.builds) == builds + 1
    assert "was built from this content before" in again.stdout + again.stderr
    assert [container(job)["imageUri"] for job in created_jobs(vertex, requests)] == [image, image]

    # A changed file is another content: built again, under another tag, and the tree is dirty.
    with open(checkout / "nli" / "__init__.py", "a") as stream:
        stream.write("# changed\n")
    changed = submit_only(vertex, launch(vertex, checkout, tmp_path / "changed"), tmp_path)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert len(cloud_build.builds) == builds + 2
    last = created_jobs(vertex, requests)[-1]
    assert container(last)["imageUri"] not in (image, None) and last["labels"]["git_dirty"] == "true"


@pytest.mark.process
def test_a_failed_build_submits_nothing_and_shows_its_logs_last_lines(
        services: tuple[FakeVertex, FakeCloudBuild], checkout: Path, tmp_path: Path) -> None:
    """The Dockerfile copies README.md; without it `docker build` fails in Cloud Build."""
    vertex, cloud_build = services
    builds, requests = len(cloud_build.builds), len(vertex.requests)
    (checkout / "README.md").unlink()
    proc = run_app(launch(vertex, checkout, tmp_path / "sweep"), cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    (fake,) = list(cloud_build.builds.values())[builds:]
    assert fake.build.status == Build.Status.FAILURE
    assert created_jobs(vertex, requests) == []
    (line,) = [line for line in output.splitlines() if f"Cloud Build {fake.build.id} ended FAILURE" in line]
    assert "fix what its log shows" in line and "Nothing was submitted" in line and fake.build.log_url in line
    log_tail = cloud_build.log_of(fake.build).splitlines()[-20:]  # failed_log_lines' default
    shown = output[output.index(line) + len(line):].splitlines()[1:len(log_tail) + 1]
    assert [text.strip() for text in shown] == [text.strip() for text in log_tail]
    assert shown[-1].strip().startswith('ERROR: build step 0 "gcr.io/cloud-builders/docker" failed')
    assert any("stat README.md: file does not exist" in text for text in shown)
    assert "vertex_launcher/" not in output  # no traceback of the launcher's (the emulator's threads may print theirs)


def changed(checkout: Path, why: str) -> None:
    """A content of the test's own: no earlier test's image has its tag."""
    with open(checkout / "nli" / "__init__.py", "a") as stream:
        stream.write(f"# {why}\n")


def working_build(cloud_build: FakeCloudBuild, builds: int) -> Build:
    """The build created after the first ``builds``, once it is working."""
    cloud_build.vertex.wait_for(lambda: len(cloud_build.builds) > builds and list(cloud_build.builds.values())[
        builds].build.status == Build.Status.WORKING, timeout=60)
    return list(cloud_build.builds.values())[builds].build


@pytest.mark.process
def test_a_launch_of_content_that_is_being_built_waits_for_that_build(
        services: tuple[FakeVertex, FakeCloudBuild], checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sweeps of one checkout started together: the second joins the first one's build. A third, into
    another repository, builds its own image of the same content."""
    vertex, cloud_build = services
    changed(checkout, "built by two launches at once")
    monkeypatch.setattr(cloud_build, "working_seconds", 2.0)
    settings = VertexLauncherConf(project=PROJECT, staging_bucket=BUCKET, api_endpoint=vertex.endpoint, build=True,
                                  source_dir=str(checkout), poll_interval=0.1)
    elsewhere = dataclasses.replace(settings, build_repository=f"{REPOSITORY.rsplit('/', 2)[0]}/other/train")
    builds = len(cloud_build.builds)
    first: List[Image] = []
    other: List[Image] = []
    threads = [threading.Thread(target=lambda: first.append(image_of_source(settings, checkout, BUCKET))),
               threading.Thread(target=lambda: other.append(image_of_source(elsewhere, checkout, BUCKET)))]
    threads[0].start()
    try:
        working_build(cloud_build, builds)
        threads[1].start()
        second = image_of_source(settings, checkout, BUCKET)
    finally:
        for thread in threads:
            thread.join(timeout=60)
    ours, theirs = [fake.build for fake in list(cloud_build.builds.values())[builds:]]  # two builds for three
    assert ours.status == theirs.status == Build.Status.SUCCESS
    assert first == [second] and second.digest == ours.results.images[0].digest
    assert other[0].uri.startswith(elsewhere.build_repository) and other[0].digest == theirs.results.images[0].digest


@pytest.mark.process
def test_ctrl_c_while_building_leaves_the_build_running_says_how_to_stop_it_and_submits_nothing(
        services: tuple[FakeVertex, FakeCloudBuild], checkout: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    vertex, cloud_build = services
    changed(checkout, "interrupted while building")
    monkeypatch.setattr(cloud_build, "working_seconds", 60.0)
    builds, requests = len(cloud_build.builds), len(vertex.requests)
    proc = sweep_cli(launch(vertex, checkout, tmp_path / "sweep")[1:], cwd=tmp_path)
    try:
        build = working_build(cloud_build, builds)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, output
    assert (f"Stopped waiting; nothing was submitted. Cloud Build {build.id} goes on, and the next launch of this "
            f"content uses its image (or waits for it); to stop it: gcloud builds cancel {build.id} "
            "--region=us-central1") in output
    assert "Traceback" not in output and created_jobs(vertex, requests) == []
    assert cloud_build.builds[build.id].build.status == Build.Status.WORKING  # not cancelled


@pytest.mark.process
def test_an_image_uri_that_is_not_in_artifact_registry_is_refused_before_submitting(
        services: tuple[FakeVertex, FakeCloudBuild], tmp_path: Path) -> None:
    vertex, _ = services
    requests = len(vertex.requests)
    missing = f"{REPOSITORY}:never-pushed"
    proc = run_app(["-m", "hydra/launcher=vertex", f"hydra.launcher.project={PROJECT}",
                    f"hydra.launcher.staging_bucket={BUCKET}", f"hydra.launcher.api_endpoint={vertex.endpoint}",
                    f"hydra.launcher.image_uri={missing}", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hw=cpu", *FAST],
                   cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and f"hydra.launcher.image_uri={missing} is not in Artifact Registry" in output
    assert "hydra.launcher.build=true" in output and "vertex_launcher/" not in output
    assert created_jobs(vertex, requests) == []


@pytest.mark.parametrize("settings, message", [
    (["hydra.launcher.image_uri=x/y:z"], "pass one"),
    (["hydra.launcher.build_repository=gcr.io/p/train"], "is not an Artifact Registry image"),
    (["+hydra.launcher.build_substitutions._TAG=v1"], "is set by the launcher"),
    (["hydra.launcher.packaging=python_package"], "needs hydra.launcher.packaging=container"),
])
def test_build_settings_are_checked_before_anything_runs(
        services: tuple[FakeVertex, FakeCloudBuild], checkout: Path, tmp_path: Path, settings: List[str],
        message: str) -> None:
    vertex, cloud_build = services
    builds, requests = len(cloud_build.builds), len(vertex.requests)
    proc = run_app(launch(vertex, checkout, tmp_path / "sweep", *settings), cwd=tmp_path)
    assert proc.returncode == 1 and message in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert len(cloud_build.builds) == builds and created_jobs(vertex, requests) == []  # asked the registry only


@pytest.mark.process
def test_dry_run_names_the_image_and_the_commit_and_builds_nothing(
        services: tuple[FakeVertex, FakeCloudBuild], checkout: Path, tmp_path: Path) -> None:
    vertex, cloud_build = services
    builds, requests = len(cloud_build.builds), len(vertex.requests)
    proc = run_app(launch(vertex, checkout, tmp_path / "sweep", "hydra.launcher.dry_run=true"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = json.loads((tmp_path / "sweep" / "custom_jobs" / "0.json").read_text())["customJob"]
    tag, _ = _context.image_tag(checkout, {})
    env = {variable["name"]: variable["value"] for variable in container(job)["env"]}
    assert container(job)["imageUri"] == env["NLI_IMAGE_URI"] == f"{REPOSITORY}:{tag}"
    assert env["NLI_GIT_COMMIT"] == job["labels"]["git_commit"] == head(checkout)
    assert len(cloud_build.builds) == builds and created_jobs(vertex, requests) == []  # asked the registry only


# ------------------------------------------------------------------------------ the build context


def test_the_context_is_what_docker_leaves_after_dockerignore() -> None:
    """The launcher's reading of .dockerignore agrees with docker-py's matcher on every file of the
    repository, and the Dockerfile, which Docker always sends, is in."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split()
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.strip().startswith("#")]
    docker = PatternMatcher(lines)
    patterns = _context.read_dockerignore((ROOT / ".dockerignore").read_text())
    sample = [path for path in [*files, "outputs/run/model.bin", "a/__pycache__/x.pyc", "nli/x.pyc", "wandb/run/x",
                                "train.log", "conf/local/vertex.yaml"] if path not in _context.ALWAYS_SENT]
    ignored = {path for path in sample if _context.ignored(path, patterns)}
    assert ignored == {path for path in sample if docker.matches(path)}
    assert {"tests/conftest.py", "outputs/run/model.bin", "docs/vertex.md", "conf/local/vertex.yaml"} <= ignored
    context = _context.context_files(ROOT)
    assert "Dockerfile" in context and "nli/__init__.py" in context and "train.py" in context
    assert not any(path.startswith(("tests/", ".git/", "docs/")) for path in context)


@pytest.mark.parametrize("patterns, path, expected", [
    (["a/**/b"], "a/x/y/b", True),
    (["a/**/b"], "a/b/c", True),  # a folder that matches leaves out what is in it
    (["*.md", "!README.md"], "README.md", False),
    (["notes", "!notes/keep.md"], "notes/keep.md", False),
    (["/build"], "build/x", True),
    (["[a-c]*.py"], "b.py", True),
    (["[^a]*.py"], "a.py", False),
    (["?.txt"], "ab.txt", False),
])
def test_dockerignore_rules_as_docker_reads_them(patterns: List[str], path: str, expected: bool) -> None:
    assert _context.ignored(path, _context.read_dockerignore("\n".join(patterns))) is expected


def test_the_tag_follows_the_content_and_the_build_settings(checkout: Path) -> None:
    tag, files = _context.image_tag(checkout, {})
    assert _context.image_tag(checkout, {})[0] == tag and len(tag) == len("src-") + 32
    assert _context.image_tag(checkout, {"substitution _TARGET": "tpu"})[0] != tag
    (checkout / "outputs").mkdir()
    (checkout / "outputs" / "model.bin").write_bytes(b"ignored")  # run outputs are not in the image
    assert _context.image_tag(checkout, {})[0] == tag
    (checkout / "train.py").chmod(0o755)  # the mode goes into the image too
    assert _context.image_tag(checkout, {})[0] != tag
    archive = _context.tarball(checkout, files)
    assert archive == _context.tarball(checkout, files)  # the same content, the same bytes


# ------------------------------------------------------------------------------ the fake against the client


def test_the_fake_cloud_build_speaks_the_clients_protocol(services: tuple[FakeVertex, FakeCloudBuild]) -> None:
    import fsspec

    vertex, cloud_build = services
    client = CloudBuildClient(credentials=AnonymousCredentials(), transport="rest",
                              client_options=ClientOptions(api_endpoint=vertex.endpoint))
    with fsspec.open("gs://test-bucket/protocol/source.tar.gz", "wb") as stream:
        stream.write(_context.tarball(ROOT, _context.context_files(ROOT)))
    build = {"steps": [{"name": "gcr.io/cloud-builders/docker", "args": ["build", "--tag=${_IMAGE}", "."]}],
             "images": ["${_IMAGE}"], "substitutions": {"_IMAGE": f"{REPOSITORY}:protocol"},
             "source": {"storage_source": {"bucket": "test-bucket", "object_": "protocol/source.tar.gz"}},
             "tags": ["protocol"]}
    parent = f"projects/{PROJECT}/locations/us-central1"
    operation = client.create_build(request={"parent": parent, "build": build})
    assert operation.metadata.build.status == Build.Status.QUEUED
    done = operation.result(timeout=30)  # polls operations.get until done
    assert done.status == Build.Status.SUCCESS and done.images == [f"{REPOSITORY}:protocol"]
    assert vertex.registry[f"{REPOSITORY}:protocol"] == done.results.images[0].digest
    got = client.get_build(request={"name": f"{parent}/builds/{done.id}"})
    assert got.status == Build.Status.SUCCESS
    listed = client.list_builds(request={"parent": parent, "filter": 'tags="protocol"'})
    assert [found.id for found in listed] == [done.id]
    with pytest.raises(exceptions.BadRequest, match='key "_UNUSED" in the substitution data is not matched'):
        client.create_build(request={"parent": parent,
                                     "build": {**build, "substitutions": {**build["substitutions"], "_UNUSED": "x"}}})
    cloud_build.fail_next(["boom"])
    failed = client.create_build(request={"parent": parent, "build": build})
    with pytest.raises(exceptions.GoogleAPICallError, match="Build failed"):
        failed.result(timeout=30)
    assert cloud_build.log_of(failed.metadata.build).splitlines()[-1].startswith("ERROR: build step 0")


def test_a_staging_bucket_that_does_not_exist_is_one_line_and_nothing_is_built(
        services: tuple[FakeVertex, FakeCloudBuild], checkout: Path, tmp_path: Path) -> None:
    """The build context goes to the staging bucket first: a bucket that is not there stops the sweep with the
    setting named, before any build or job."""
    vertex, cloud_build = services
    builds, requests = len(cloud_build.builds), len(vertex.requests)
    with open(checkout / "nli" / "__init__.py", "a") as stream:  # content no earlier build had: it must upload
        stream.write("# a content of its own\n")
    missing = "gs://no-such-bucket/sweeps"
    args = [f"hydra.launcher.staging_bucket={missing}" if arg.startswith("hydra.launcher.staging_bucket=") else arg
            for arg in launch(vertex, checkout, tmp_path / "sweep")]
    proc = run_app(args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert "hydra.launcher.staging_bucket=gs://no-such-bucket/sweeps" in line, proc.stderr
    assert "gcloud storage buckets create" in line and line.endswith("nothing was built or submitted")
    assert "Traceback" not in proc.stderr
    assert len(cloud_build.builds) == builds and created_jobs(vertex, requests) == []  # asked the registry only
