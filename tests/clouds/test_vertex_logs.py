"""Following the jobs' logs (``stream_logs``, ``python -m nli.cloud logs``) against the fake Vertex AI's Cloud
Logging, with the real google-cloud-logging client: each line of each job once, in order, whichever jobs a
poll asks about and however much one of them writes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from google.cloud.aiplatform_v1 import JobState

from hydra_plugins.vertex_launcher._client import Vertex
from hydra_plugins.vertex_launcher._logs import JobLogs
from hydra_plugins.vertex_launcher.config import VertexLauncherConf
from tests.clouds.fake_vertex import FakeVertex

PROJECT = "test-project"
IMAGE = "us-docker.pkg.dev/test-project/images/printer:latest"
# The image's program: print $NAME-0 .. $NAME-<$FIRST - 1>; given $GATE, also write the start of a line, wait
# for the file $GATE, end that line and print $MORE more.
PROGRAM = """
import os, sys, time
name, first, more = os.environ["NAME"], int(os.environ["FIRST"]), int(os.environ.get("MORE", "0"))
for i in range(first):
    print(f"{name}-{i}")
sys.stdout.flush()
if os.environ.get("GATE"):
    print(f"{name}-{first} begun", end="", flush=True)
    while not os.path.exists(os.environ["GATE"]):
        time.sleep(0.05)
    print(" and ended")
    for i in range(first + 1, first + 1 + more):
        print(f"{name}-{i}")
"""

pytestmark = pytest.mark.process


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeVertex]:
    with FakeVertex(log_dir=tmp_path / "logs", pending_seconds=0.05) as fake:
        fake.add_image(IMAGE, entrypoint=[sys.executable, "-c", PROGRAM], workdir=tmp_path)
        yield fake


@pytest.fixture
def settings(fake: FakeVertex) -> VertexLauncherConf:
    return VertexLauncherConf(project=PROJECT, staging_bucket="gs://test-bucket", image_uri=IMAGE,
                              api_endpoint=fake.endpoint)


def start(fake: FakeVertex, settings: VertexLauncherConf, lines: int, **env: str) -> str:
    """Submit a job printing ``lines`` lines and wait until it has printed them; its name."""
    variables = [{"name": key, "value": value} for key, value in {"FIRST": str(lines), **env}.items()]
    pool = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            "container_spec": {"image_uri": IMAGE, "env": variables}}
    created = Vertex(settings).create({"display_name": env["NAME"], "job_spec": {"worker_pool_specs": [pool]}})
    fake.wait_for(lambda: fake.jobs[created.name].log.count("\n") >= lines, timeout=30)
    return created.name


def ended(fake: FakeVertex, name: str) -> None:
    fake.wait_for(lambda: fake.jobs[name].state is JobState.JOB_STATE_SUCCEEDED, timeout=30)


@pytest.mark.parametrize("per_timestamp", [1, 4])
def test_a_job_left_out_of_a_poll_keeps_its_place_and_the_others_theirs(fake: FakeVertex,
                                                                        settings: VertexLauncherConf,
                                                                        tmp_path: Path, per_timestamp: int) -> None:
    """As a sweep polls: all jobs, then the running ones once one has ended, then all again at the end; also
    where lines share a timestamp (a poll between two of them must not lose or repeat one)."""
    fake.lines_per_timestamp = per_timestamp
    first = start(fake, settings, 3, NAME="a")
    ended(fake, first)
    second = start(fake, settings, 3, NAME="b", GATE=str(tmp_path / "gate"), MORE="2")
    logs = JobLogs(settings)
    assert logs.new_lines([first, second]) == {first: ["a-0", "a-1", "a-2"], second: ["b-0", "b-1", "b-2"]}
    assert logs.new_lines([second]) == {second: []}  # "b-3 begun" is not a line until it ends
    (tmp_path / "gate").touch()
    ended(fake, second)
    assert logs.new_lines([first, second]) == {first: [], second: ["b-3 begun and ended", "b-4", "b-5"]}
    assert logs.new_lines([first, second]) == {first: [], second: []}


def test_a_quiet_job_does_not_hold_back_a_chatty_one(fake: FakeVertex, settings: VertexLauncherConf,
                                                     tmp_path: Path) -> None:
    """Over a thousand new lines of one job after a single line of another: a poll reads a page of 1,000
    entries, and each poll goes on from where the last one stopped, job by job."""
    quiet = start(fake, settings, 1, NAME="quiet", GATE=str(tmp_path / "gate"))
    chatty = start(fake, settings, 2500, NAME="chatty")
    ended(fake, chatty)
    logs = JobLogs(settings)
    seen: Dict[str, List[str]] = {quiet: [], chatty: []}
    for _ in range(4):
        for name, lines in logs.new_lines([quiet, chatty]).items():
            seen[name] += lines
    assert seen == {quiet: ["quiet-0"], chatty: [f"chatty-{i}" for i in range(2500)]}
    (tmp_path / "gate").touch()


def test_the_last_lines_of_a_job_are_its_own(fake: FakeVertex, settings: VertexLauncherConf) -> None:
    first = start(fake, settings, 5, NAME="a")
    second = start(fake, settings, 5, NAME="b")
    for name in (first, second):
        ended(fake, name)
    assert JobLogs(settings).last_lines(second, 3) == ["b-2", "b-3", "b-4"]
