"""hydra/launcher=vertex as a user meets it on day one, through train.py (run_app) and the fake Vertex AI
service (tests/clouds/fake_vertex.py): the machine chosen on purpose, the launcher named without -m, refusals as
one line, python_package only on an image of the pinned torch, and the user's defaults (presets,
conf/local/vertex.yaml, Google's environment variables). Every refusal comes before anything is
submitted: the fake records no request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from hydra_plugins.vertex_launcher._images import PREBUILT_PYTORCH
from tests.clouds.fake_vertex import FakeVertex
from tests.clouds.test_vertex import BUCKET, IMAGE, launcher
from tests.clouds.test_vertex import fake as fake_vertex  # noqa: F401 (a fixture: the service, one per module)
from tests.support.runs import CONF, FAST, ROOT, run_app


@pytest.fixture(scope="module")
def fake(fake_vertex: FakeVertex) -> FakeVertex:  # noqa: F811 (the imported fixture, by name)
    return fake_vertex


def sweep(fake: FakeVertex, tmp_path: Path, *args: str, env: Dict[str, Any] | None = None) -> Any:
    """``python train.py -m ARGS`` in this process; the exit status, stdout and stderr, and how many requests
    reached the fake meanwhile."""
    before = len(fake.requests)
    proc = run_app(["-m", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=env)
    proc.requests = len(fake.requests) - before
    return proc


def request(tmp_path: Path, num: int = 0) -> Dict[str, Any]:
    """The CustomJob request a dry run wrote for job ``num``."""
    return json.loads((tmp_path / "sweep" / "custom_jobs" / f"{num}.json").read_text())


def refused(proc: Any, start: str) -> str:
    """The refusal's one line, checked: exit status 1, nothing submitted, no traceback."""
    assert (proc.returncode, proc.requests) == (1, 0), proc.stderr
    assert proc.stderr.startswith(f"error: {start}"), proc.stderr
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr
    return str(proc.stderr)


# ------------------------------------------------------------------------------ the machine, on purpose


def test_hw_auto_is_refused_naming_the_presets(fake: FakeVertex, tmp_path: Path) -> None:
    proc = sweep(fake, tmp_path, *launcher(fake, hw=None), *FAST, "seed=1,2")  # hw: the default, auto
    message = refused(proc, "hw=auto names no machine")
    presets = sorted(path.stem for path in (CONF / "hw").glob("*.yaml") if path.stem != "auto")
    assert f"(hw options: {', '.join(presets)})" in message and "hw=cpu asks for a CPU job on purpose" in message
    assert message.count("\n") == 1  # one line


def test_hw_cpu_is_a_cpu_job_on_purpose(fake: FakeVertex, tmp_path: Path) -> None:
    proc = sweep(fake, tmp_path, *launcher(fake, hw="cpu"), "hydra.launcher.dry_run=true")
    assert proc.returncode == 0, proc.stderr
    pool = request(tmp_path)["customJob"]["jobSpec"]["workerPoolSpecs"][0]
    assert pool["machineSpec"] == {"machineType": "n1-standard-8"}


@pytest.mark.parametrize("preset", ["tpu-v2-8", "tpu-v3-8"])
def test_a_tpu_that_cannot_train_yet_is_refused_with_the_reason(fake: FakeVertex, tmp_path: Path,
                                                                preset: str) -> None:
    proc = sweep(fake, tmp_path, *launcher(fake, hw=None), f"hw=v100,{preset}")  # the GPU job would go alone
    message = refused(proc, f"hw={preset} cannot train yet: TPU {preset[4:6]}: PyTorch/XLA runs each chip's two")
    assert "hw=tpu-v5e-8" in message


# ------------------------------------------------------------------------------ the launcher needs -m


@pytest.mark.parametrize("choice", ["hydra/launcher=vertex", "hydra/launcher=vertex-spot",
                                    "hydra/launcher=submitit_slurm"])
def test_a_launcher_named_without_m_says_to_add_it(fake: FakeVertex, tmp_path: Path, choice: str) -> None:
    before = len(fake.requests)
    args = [choice, "hw=v100", "task=rte", "seed=1", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = run_app(args, cwd=tmp_path)
    assert proc.returncode == 1 and len(fake.requests) == before
    assert proc.stderr == (f"error: {choice} launches a sweep's jobs, and without -m Hydra runs this one here, on "
                           f"this machine: add -m (python train.py -m {' '.join(args)}; a sweep of one job is fine)\n")
    assert not (tmp_path / "run").exists()  # nothing trained here, nothing written


# ------------------------------------------------------------------------------ the launcher's refusals


def test_a_launcher_refusal_is_one_line_on_stderr(fake: FakeVertex, tmp_path: Path) -> None:
    args = [arg for arg in launcher(fake) if not arg.startswith("hydra.launcher.project=")]
    proc = sweep(fake, tmp_path, *args, *FAST, env={"GOOGLE_CLOUD_PROJECT": None})
    assert refused(proc, "hydra.launcher.project is not set: pass hydra.launcher.project=MY_PROJECT").count("\n") == 1
    assert not (tmp_path / "sweep").exists()  # no empty folder that looks like a sweep's


# ------------------------------------------------------------------------------ python_package


def test_python_package_without_a_prebuilt_image_of_the_pinned_torch_is_refused(fake: FakeVertex,
                                                                                tmp_path: Path) -> None:
    proc = sweep(fake, tmp_path, *launcher(fake), "hydra.launcher.packaging=python_package",
                 f"hydra.launcher.source_dir={ROOT}")
    message = refused(proc, "hydra.launcher.packaging=python_package: the project pins torch==")
    assert "Use hydra.launcher.packaging=container with the project's Dockerfile" in message
    assert "hydra.launcher.executor_image_uri=IMAGE" in message
    assert not (tmp_path / "sweep" / "code").exists()  # no sdist built


def pinning(tmp_path: Path, torch: str, python: str = "") -> Path:
    """A project that pins torch==``torch`` (its sdist builds here, not in the checkout), and where ``python`` is
    given, requires that Python."""
    project = tmp_path / "project"
    project.mkdir()
    requires = f'requires-python = "{python}"\n' if python else ""
    (project / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n'
                                            'build-backend = "setuptools.build_meta"\n\n'
                                            f'[project]\nname = "pins-torch"\nversion = "1"\n{requires}'
                                            f'dependencies = ["numpy", "torch=={torch}"]\n\n'
                                            '[tool.setuptools]\npy-modules = []\n')
    return project


def test_the_prebuilt_image_of_the_pinned_torch_is_picked(fake: FakeVertex, tmp_path: Path) -> None:
    proc = sweep(fake, tmp_path, *launcher(fake), "hydra.launcher.packaging=python_package",
                 f"hydra.launcher.source_dir={pinning(tmp_path, '2.3.1')}", "hydra.launcher.dry_run=true")
    assert proc.returncode == 0, proc.stderr
    spec = request(tmp_path)["customJob"]["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]
    assert spec["executorImageUri"] == "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-3.py310:latest"


def test_a_prebuilt_image_of_another_torch_is_taken_only_on_purpose(fake: FakeVertex, tmp_path: Path) -> None:
    other = PREBUILT_PYTORCH["2.4"]
    args = [*launcher(fake), "hydra.launcher.packaging=python_package", f"hydra.launcher.executor_image_uri={other}",
            f"hydra.launcher.source_dir={pinning(tmp_path, '2.3.1')}"]
    message = refused(sweep(fake, tmp_path, *args), f"hydra.launcher.executor_image_uri={other} is Vertex AI's "
                      "prebuilt image of torch 2.4, and the project pins torch==2.3.1 (pyproject.toml): pip would")
    assert message.rstrip().endswith("or, knowing that, add hydra.launcher.replace_image_torch=true")
    assert not (tmp_path / "sweep" / "code").exists()
    accepted = sweep(fake, tmp_path, *args, "hydra.launcher.replace_image_torch=true", "hydra.launcher.dry_run=true")
    assert accepted.returncode == 0, accepted.stderr
    spec = request(tmp_path)["customJob"]["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]
    assert spec["executorImageUri"] == other


@pytest.mark.parametrize("named", [False, True], ids=["picked", "named-on-purpose"])
def test_a_prebuilt_image_of_a_python_the_project_refuses_is_refused_before_anything_is_built(
        fake: FakeVertex, tmp_path: Path, named: bool) -> None:
    """Vertex AI's prebuilt images run Python 3.10 (.py310 in their names); a project that requires 3.11, as this
    one does, would be refused by pip on each job's machine after its minutes of start-up."""
    image = PREBUILT_PYTORCH["2.3"]
    chosen = [f"hydra.launcher.executor_image_uri={image}", "hydra.launcher.replace_image_torch=true"] if named else []
    proc = sweep(fake, tmp_path, *launcher(fake), "hydra.launcher.packaging=python_package", *chosen,
                 f"hydra.launcher.source_dir={pinning(tmp_path, '2.3.1', python='>=3.11')}")
    what = f"hydra.launcher.executor_image_uri={image}" if named else \
        f"Vertex AI's prebuilt image of the pinned torch, {image},"
    message = refused(proc, f"{what} runs Python 3.10, and the project requires Python >=3.11 (requires-python in "
                      "pyproject.toml): pip there would refuse to install it. Use hydra.launcher.packaging=container")
    assert message.rstrip().endswith("or name an image of a Python it takes: hydra.launcher.executor_image_uri=IMAGE")
    assert not (tmp_path / "sweep" / "code").exists()  # no sdist built; refused() checked that nothing was submitted


# ------------------------------------------------------------------------------ the user's defaults


def no_settings(fake: FakeVertex) -> List[str]:
    """The fake's endpoint and the job's machine alone: project, bucket, image and region come from elsewhere."""
    return ["hydra/launcher=vertex", f"hydra.launcher.api_endpoint={fake.endpoint}", "hw=cpu",
            "hydra.launcher.dry_run=true"]


def test_the_users_local_config_and_googles_variables_are_read(fake: FakeVertex, tmp_path: Path) -> None:
    """conf/local/vertex.yaml, where Hydra finds it (here a folder of the search path, as conf/ is), gives the
    launcher its settings; the command line still overrides it."""
    local = tmp_path / "user-conf" / "local"
    local.mkdir(parents=True)
    account = "jobs@my-project.iam.gserviceaccount.com"
    (local / "vertex.yaml").write_text(f"project: my-project\nstaging_bucket: {BUCKET}\nimage_uri: {IMAGE}\n"
                                       f"region: europe-west4\nservice_account: {account}\n")
    proc = sweep(fake, tmp_path, *no_settings(fake), f"hydra.searchpath=[file://{tmp_path / 'user-conf'}]",
                 "hydra.launcher.region=asia-east1", env={"GOOGLE_CLOUD_PROJECT": "env-project"})
    assert proc.returncode == 0, proc.stderr
    sent = request(tmp_path)
    assert sent["parent"] == "projects/my-project/locations/asia-east1"
    job = sent["customJob"]
    assert job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["imageUri"] == IMAGE
    assert job["jobSpec"]["serviceAccount"] == account
    assert job["jobSpec"]["baseOutputDirectory"]["outputUriPrefix"].startswith(f"{BUCKET}/")


def test_a_broken_local_config_is_named_with_its_line(fake: FakeVertex, tmp_path: Path) -> None:
    local = tmp_path / "user-conf" / "local"
    local.mkdir(parents=True)
    (local / "vertex.yaml").write_text("project: [my-project\n")  # edited by hand
    proc = sweep(fake, tmp_path, *no_settings(fake), f"hydra.searchpath=[file://{tmp_path / 'user-conf'}]")
    message = refused(proc, f"a config file is not valid YAML: {local / 'vertex.yaml'}, line 2, column 1: "
                            "expected ',' or ']', but got '<stream end>'")
    assert message.count("\n") == 1  # one line


def test_without_a_local_config_googles_variables_are_read(fake: FakeVertex, tmp_path: Path) -> None:
    proc = sweep(fake, tmp_path, *no_settings(fake), f"hydra.launcher.staging_bucket={BUCKET}",
                 f"hydra.launcher.image_uri={IMAGE}",
                 env={"GOOGLE_CLOUD_PROJECT": "env-project", "CLOUDSDK_COMPUTE_REGION": "europe-west4"})
    assert proc.returncode == 0, proc.stderr
    assert request(tmp_path)["parent"] == "projects/env-project/locations/europe-west4"


def test_what_the_user_told_gcloud_is_read(fake: FakeVertex, tmp_path: Path) -> None:
    """``gcloud config set project ...`` and ``gcloud config set ai/region ...`` in the active configuration
    are the launcher's project and region; a property's variable and GOOGLE_CLOUD_PROJECT come first."""
    gcloud = tmp_path / "gcloud"
    (gcloud / "configurations").mkdir(parents=True)
    (gcloud / "active_config").write_text("work")
    (gcloud / "configurations" / "config_default").write_text("[core]\nproject = not-the-active-one\n")
    (gcloud / "configurations" / "config_work").write_text(
        "[core]\naccount = me@example.com\nproject = gcloud-project\n\n[compute]\nregion = europe-west1\n\n"
        "[ai]\nregion = asia-northeast1\n")
    settings = [*no_settings(fake), f"hydra.launcher.staging_bucket={BUCKET}", f"hydra.launcher.image_uri={IMAGE}"]
    for env, parent in [
        ({}, "projects/gcloud-project/locations/asia-northeast1"),
        ({"CLOUDSDK_CORE_PROJECT": "variable-project", "CLOUDSDK_AI_REGION": "us-east1"},
         "projects/variable-project/locations/us-east1"),
        ({"GOOGLE_CLOUD_PROJECT": "env-project", "CLOUDSDK_ACTIVE_CONFIG_NAME": "default"},
         "projects/env-project/locations/us-central1"),  # the default configuration sets no region
    ]:
        proc = sweep(fake, tmp_path, *settings, env={"CLOUDSDK_CONFIG": str(gcloud), **env})
        assert proc.returncode == 0, proc.stderr
        assert request(tmp_path)["parent"] == parent, env
    (gcloud / "configurations" / "config_work").write_text("[ai]\nregion = asia-northeast1\n")  # no project
    proc = sweep(fake, tmp_path, *settings, env={"CLOUDSDK_CONFIG": str(gcloud)})
    refused(proc, "hydra.launcher.project is not set")
    (gcloud / "configurations" / "config_work").write_text("project = before-any-section\n")  # edited by hand
    proc = sweep(fake, tmp_path, *settings, env={"CLOUDSDK_CONFIG": str(gcloud)})
    refused(proc, "hydra.launcher.project is not set")
    assert (f"gcloud's configuration {gcloud / 'configurations' / 'config_work'} cannot be read (File contains no "
            "section headers.") in proc.stdout + proc.stderr


def test_vertex_spot_is_vertex_on_spot_vms(fake: FakeVertex, tmp_path: Path) -> None:
    proc = sweep(fake, tmp_path, "hydra/launcher=vertex-spot", *launcher(fake)[1:], "hydra.launcher.dry_run=true",
                 "seed=1,2")
    assert (proc.returncode, proc.requests) == (0, 0), proc.stderr
    jobs = [request(tmp_path, num)["customJob"] for num in (0, 1)]
    assert [job["jobSpec"]["scheduling"] for job in jobs] == [{"strategy": "SPOT"}] * 2
    assert [job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["imageUri"] for job in jobs] == [IMAGE] * 2
