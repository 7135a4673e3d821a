"""The fake Vertex AI service (tests/clouds/fake_vertex.py) against the real GAPIC clients over REST.

Each test goes through ``JobServiceClient`` or ``SecretManagerServiceClient`` exactly as the launcher does, so that
the fake is held to the protocol the real client speaks, not to what we believe about it.
"""

from __future__ import annotations

import io
import json
import re
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, Iterator, List

import google_crc32c
import pytest
import requests
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.aiplatform_v1 import CustomJob, JobServiceClient, JobState
from google.cloud.secretmanager_v1 import SecretManagerServiceClient

from tests.clouds.fake_vertex import FakeVertex

PARENT = "projects/test-project/locations/us-central1"
IMAGE = "us-docker.pkg.dev/test-project/images/trainer:latest"
# The image's program: write the environment it got to $OUT_FILE, then exit $EXIT_CODE, or, given "sleep", start a
# child (as a training launcher would start workers) and sleep.
PROGRAM = """
import json, os, subprocess, sys, time
sleep = sys.argv[1:] == ["sleep"]
child = subprocess.Popen(["sleep", "60"]).pid if sleep else None
open(os.environ["OUT_FILE"], "w").write(json.dumps({"env": dict(os.environ), "pid": os.getpid(), "child": child}))
time.sleep(60 if sleep else 0)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""
ENDED = {JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeVertex]:
    with FakeVertex(log_dir=tmp_path / "logs", job_env={"HF_HUB_OFFLINE": "1"}, pending_seconds=0.1,
                    cancel_grace_seconds=0.5) as fake:
        fake.add_image(IMAGE, entrypoint=[sys.executable, "-c", PROGRAM], workdir=tmp_path, env={"FROM_IMAGE": "1"})
        yield fake


@pytest.fixture
def client(fake: FakeVertex) -> JobServiceClient:
    return JobServiceClient(credentials=AnonymousCredentials(), transport="rest",
                            client_options=ClientOptions(api_endpoint=fake.endpoint))


def container_job(out_file: Path, *args: str, env: Dict[str, str] | None = None, **fields: object) -> CustomJob:
    """A one-replica job running IMAGE, in the shape the launcher submits."""
    variables = [{"name": k, "value": v} for k, v in {"OUT_FILE": str(out_file), **(env or {})}.items()]
    pool = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            "container_spec": {"image_uri": IMAGE, "args": list(args), "env": variables}}
    spec = {"worker_pool_specs": [pool], "base_output_directory": {"output_uri_prefix": "gs://test-bucket/run"}}
    return CustomJob({"display_name": "trial-0", "job_spec": spec, **fields})


def wait_until_ended(client: JobServiceClient, name: str, timeout: float = 15) -> CustomJob:
    deadline = time.monotonic() + timeout
    while (job := client.get_custom_job(name=name)).state not in ENDED:
        assert time.monotonic() < deadline, f"{name} still {job.state.name}"
        time.sleep(0.05)
    return job


def read_output(out_file: Path) -> dict:
    return json.loads(out_file.read_text())


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (killed, not yet reaped by whatever adopted it) counts as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.process
def test_container_job_succeeds_with_vertex_environment(fake: FakeVertex, client: JobServiceClient,
                                                        tmp_path: Path) -> None:
    out_file = tmp_path / "out.json"
    created = client.create_custom_job(parent=PARENT, custom_job=container_job(out_file, env={"TRIAL": "0"},
                                                                               labels={"sweep": "s1"}))
    assert created.name.startswith(f"{PARENT}/customJobs/")
    assert created.state == JobState.JOB_STATE_PENDING and created.create_time
    fake.wait_for(lambda: client.get_custom_job(name=created.name).state == JobState.JOB_STATE_RUNNING)
    job = wait_until_ended(client, created.name)
    assert job.state == JobState.JOB_STATE_SUCCEEDED, fake.jobs[created.name].log
    assert job.create_time <= job.start_time <= job.end_time and job.labels == {"sweep": "s1"}
    env = read_output(out_file)["env"]
    assert env["TRIAL"] == "0" and env["FROM_IMAGE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["AIP_MODEL_DIR"] == "gs://test-bucket/run/model/"
    assert env["AIP_CHECKPOINT_DIR"] == "gs://test-bucket/run/checkpoints/"
    assert env["AIP_TENSORBOARD_LOG_DIR"] == "gs://test-bucket/run/logs/"
    assert env["CLOUD_ML_JOB_ID"] == created.name.rsplit("/", 1)[1] and env["CLOUD_ML_REGION"] == "us-central1"
    assert json.loads(env["CLUSTER_SPEC"])["task"] == {"type": "workerpool0", "index": 0}
    assert fake.requests[0][:2] == ("POST", f"/v1/{PARENT}/customJobs?%24alt=json%3Benum-encoding%3Dint")


@pytest.mark.process
def test_job_does_not_inherit_the_submitters_environment(fake: FakeVertex, client: JobServiceClient, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONLY_IN_TEST_PROCESS", "hunter2")
    out_file = tmp_path / "out.json"
    job = wait_until_ended(client, client.create_custom_job(parent=PARENT, custom_job=container_job(out_file)).name)
    assert job.state == JobState.JOB_STATE_SUCCEEDED
    assert "ONLY_IN_TEST_PROCESS" not in read_output(out_file)["env"]
    assert "ONLY_IN_TEST_PROCESS" not in fake.jobs[job.name].env


@pytest.mark.process
def test_non_zero_exit_fails_the_job_with_vertex_message(client: JobServiceClient, tmp_path: Path) -> None:
    custom_job = container_job(tmp_path / "out.json", env={"EXIT_CODE": "3"})
    job = wait_until_ended(client, client.create_custom_job(parent=PARENT, custom_job=custom_job).name)
    assert job.state == JobState.JOB_STATE_FAILED and job.error.code == 3
    assert job.error.message.startswith("The replica workerpool0-0 exited with a non-zero status of 3.")


@pytest.mark.process
def test_cancel_kills_the_process(fake: FakeVertex, client: JobServiceClient, tmp_path: Path) -> None:
    out_file = tmp_path / "out.json"
    name = client.create_custom_job(parent=PARENT, custom_job=container_job(out_file, "sleep")).name
    fake.wait_for(out_file.exists)
    client.cancel_custom_job(name=name)
    assert client.get_custom_job(name=name).state in {JobState.JOB_STATE_CANCELLING, JobState.JOB_STATE_CANCELLED}
    job = wait_until_ended(client, name)
    assert job.state == JobState.JOB_STATE_CANCELLED and (job.error.code, job.error.message) == (1, "CANCELED")
    output = read_output(out_file)
    assert not alive(output["pid"])
    fake.wait_for(lambda: not alive(output["child"]), timeout=5)  # the whole process group, as a container stops
    with pytest.raises(exceptions.BadRequest, match="JOB_STATE_CANCELLED"):  # 400 FAILED_PRECONDITION
        client.cancel_custom_job(name=name)


@pytest.mark.process
def test_timeout_and_unknown_image_fail_the_job(client: JobServiceClient, tmp_path: Path) -> None:
    slow = container_job(tmp_path / "out.json", "sleep")
    slow.job_spec.scheduling.timeout = {"seconds": 1}
    missing = container_job(tmp_path / "never.json")
    missing.job_spec.worker_pool_specs[0].container_spec.image_uri = "gcr.io/test-project/missing:1"
    timed_out = client.create_custom_job(parent=PARENT, custom_job=slow).name
    not_pulled = wait_until_ended(client, client.create_custom_job(parent=PARENT, custom_job=missing).name)
    assert not_pulled.state == JobState.JOB_STATE_FAILED and "could not be pulled" in not_pulled.error.message
    assert "timeout" in wait_until_ended(client, timed_out).error.message


def test_unknown_job_is_not_found(client: JobServiceClient) -> None:
    with pytest.raises(exceptions.NotFound, match="does not exist"):
        client.get_custom_job(name=f"{PARENT}/customJobs/123")


@pytest.mark.process
def test_list_filters_by_label(client: JobServiceClient, tmp_path: Path) -> None:
    for sweep in ("a", "b"):
        client.create_custom_job(parent=PARENT, custom_job=container_job(tmp_path / f"{sweep}.json",
                                                                         labels={"sweep": sweep}))
    listed = list(client.list_custom_jobs(request={"parent": PARENT, "filter": 'labels.sweep="b"'}))
    assert [job.labels["sweep"] for job in listed] == ["b"]
    assert len(list(client.list_custom_jobs(parent=PARENT))) == 2


def test_invalid_label_key_is_rejected(fake: FakeVertex, client: JobServiceClient, tmp_path: Path) -> None:
    # Over REST the client picks the exception by HTTP status alone: 400 is BadRequest, never its subclass
    # InvalidArgument, whatever the reply's "status" says.
    with pytest.raises(exceptions.BadRequest, match="Bad_Key") as raised:
        client.create_custom_job(parent=PARENT, custom_job=container_job(tmp_path / "o.json", labels={"Bad_Key": "x"}))
    assert raised.value.details[0]["fieldViolations"][0]["field"] == "labels"
    assert not fake.jobs


@pytest.mark.parametrize("path, value, field", [
    ("display_name", "", "display_name"),
    ("display_name", "x" * 129, "display_name"),
    ("machine_type", "n1-standard-3", "machine_spec.machine_type"),
    ("accelerator_type", 3, "machine_spec.accelerator_type"),
    ("replica_count", 0, "replica_count"),
    ("image_uri", "", "container_spec.image_uri"),
    ("env_name", "1BAD", "container_spec.env[0].name"),
    ("output_uri_prefix", "/local/dir", "base_output_directory.output_uri_prefix"),
])
def test_invalid_job_is_rejected_naming_the_field(client: JobServiceClient, tmp_path: Path, path: str, value: object,
                                                  field: str) -> None:
    job = container_job(tmp_path / "o.json")
    pool = job.job_spec.worker_pool_specs[0]
    targets = {"display_name": job, "machine_type": pool.machine_spec, "accelerator_type": pool.machine_spec,
               "replica_count": pool, "image_uri": pool.container_spec, "env_name": pool.container_spec.env[0],
               "output_uri_prefix": job.job_spec.base_output_directory}
    setattr(targets[path], "name" if path == "env_name" else path, value)
    with pytest.raises(exceptions.BadRequest, match=f"List of found errors:\t1.Field: .*{re.escape(field)}; Message: "):
        client.create_custom_job(parent=PARENT, custom_job=job)


def test_unknown_field_is_invalid_argument(fake: FakeVertex) -> None:
    # The client cannot send a field its protos lack (that happens when the library is newer than the service);
    # send the bytes directly, and read the reply the way the REST transport does.
    body = {"displayName": "x", "notAField": 1}
    reply = requests.post(f"{fake.endpoint}/v1/{PARENT}/customJobs", json=body, timeout=10)
    assert reply.json()["error"]["status"] == "INVALID_ARGUMENT"
    error = exceptions.from_http_response(reply)
    assert isinstance(error, exceptions.BadRequest) and 'Unknown name "notAField"' in error.message


@pytest.mark.process
@pytest.mark.parametrize("status, reason, raised", [
    (503, "UNAVAILABLE", exceptions.ServiceUnavailable),
    (429, "RESOURCE_EXHAUSTED", exceptions.TooManyRequests),  # not ResourceExhausted: that is a subclass
    (403, "PERMISSION_DENIED", exceptions.Forbidden),
])
def test_injected_errors_reach_the_client(fake: FakeVertex, client: JobServiceClient, tmp_path: Path, status: int,
                                          reason: str, raised: type) -> None:
    fake.fail_next("create", status=status, message="try later", reason=reason)
    with pytest.raises(raised, match="try later"):
        client.create_custom_job(parent=PARENT, custom_job=container_job(tmp_path / "o.json"))
    assert not fake.jobs and len(fake.requests) == 1
    assert client.create_custom_job(parent=PARENT, custom_job=container_job(tmp_path / "o.json")).name in fake.jobs


def test_secret_access(fake: FakeVertex) -> None:
    secrets = SecretManagerServiceClient(credentials=AnonymousCredentials(), transport="rest",
                                         client_options=ClientOptions(api_endpoint=fake.endpoint))
    fake.add_secret("projects/test-project/secrets/wandb/versions/1", "old")
    fake.add_secret("projects/test-project/secrets/wandb/versions/2", "s3cr3t")
    response = secrets.access_secret_version(name="projects/test-project/secrets/wandb/versions/latest")
    assert response.payload.data == b"s3cr3t" and response.name.endswith("/versions/2")
    assert response.payload.data_crc32c == google_crc32c.value(b"s3cr3t")
    assert secrets.access_secret_version(name="projects/test-project/secrets/wandb/versions/1").payload.data == b"old"
    with pytest.raises(exceptions.NotFound):
        secrets.access_secret_version(name="projects/test-project/secrets/other/versions/latest")
    assert fake.secret_accesses[0] == "projects/test-project/secrets/wandb/versions/latest"


def sdist(module: str, source: str) -> bytes:
    """A source distribution of one module, built the way setuptools would lay it out."""
    files = {"pyproject.toml": f'[project]\nname = "{module}"\nversion = "0.1"\n[tool.setuptools]\n'
                              f'py-modules = ["{module}"]\n',
             f"{module}.py": source}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in files.items():
            info = tarfile.TarInfo(f"{module}-0.1/{name}")
            info.size = len(text.encode())
            archive.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


@pytest.mark.process
def test_python_package_job_installs_and_runs_the_module(gcs_emulator: Dict[str, str], fake: FakeVertex,
                                                         client: JobServiceClient, tmp_path: Path) -> None:
    source = "import os, sys\nopen(sys.argv[1], 'w').write(os.environ['CLOUD_ML_JOB_ID'] + ' ' + os.getcwd())\n"
    bucket = storage.Client(project="test", credentials=AnonymousCredentials()).bucket("test-bucket")
    bucket.blob("staging/hello_job-0.1.tar.gz").upload_from_string(sdist("hello_job", source))
    out_file = tmp_path / "package.txt"
    args: List[str] = [str(out_file)]
    pool = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            "python_package_spec": {"executor_image_uri": "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu:latest",
                                    "package_uris": ["gs://test-bucket/staging/hello_job-0.1.tar.gz"],
                                    "python_module": "hello_job", "args": args}}
    custom_job = CustomJob(display_name="package", job_spec={"worker_pool_specs": [pool]})
    job = wait_until_ended(client, client.create_custom_job(parent=PARENT, custom_job=custom_job).name, timeout=60)
    assert job.state == JobState.JOB_STATE_SUCCEEDED, fake.jobs[job.name].log
    job_id, cwd = out_file.read_text().split()
    assert job_id == job.name.rsplit("/", 1)[1] and Path(cwd).name == "work"
