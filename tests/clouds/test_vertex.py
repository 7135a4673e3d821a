"""hydra/launcher=vertex end to end: real Hydra sweeps of the real train.py, submitted through the real
google-cloud-aiplatform client to the fake Vertex AI service (tests/clouds/fake_vertex.py), which runs each
job as Vertex runs a container, with the Cloud Storage emulator as the staging bucket."""

from __future__ import annotations

import csv
import json
import logging
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import fsspec
import pytest
import yaml
from google.cloud.aiplatform_v1 import AcceleratorType, JobState
from hydra import version
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobStatus
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.version import VersionBase
from omegaconf import OmegaConf

from hydra_plugins.vertex_launcher._checks import LaunchError, Refused
from hydra_plugins.vertex_launcher._client import Vertex
from hydra_plugins.vertex_launcher._core import JobFailed
from hydra_plugins.vertex_launcher._spec import labels, quote
from hydra_plugins.vertex_launcher.config import VertexLauncherConf
from nli.sweep.table import finish_open
from tests.clouds.fake_vertex import ApiError, FakeVertex
from tests.support.runs import FAST, ROOT, process_env

PROJECT = "test-project"
BUCKET = "gs://test-bucket/sweeps"
IMAGE = "us-central1-docker.pkg.dev/test-project/nli/train:test"  # the fake runs it as the Dockerfile does
SUITE_IMAGE = "us-central1-docker.pkg.dev/test-project/hydra/suite-app:test"
APP_IMAGE = "us-central1-docker.pkg.dev/test-project/hydra/integration-app:test"
WANDB_SECRET = f"projects/{PROJECT}/secrets/wandb-api-key/versions/latest"
# An image whose job dies in start-up, before the job's callback can report anything: only its log says why.
CRASH_IMAGE = "us-central1-docker.pkg.dev/test-project/nli/crash:test"
CRASH = "import sys; print('loading the model', flush=True); sys.exit('Killed: out of memory (exit 137)')"
SENTINEL = "wandb-key-0123456789abcdef-must-never-leak"
# The TPU image's stand-in (no TPU here to train on): its job composes the job's config as the image's
# train.py would and prints the hardware it would run on.
TPU_IMAGE = "us-central1-docker.pkg.dev/test-project/nli/train-tpu:test"
# python_package's executor: an image of the pinned torch (Vertex AI has no prebuilt one of it); the fake runs
# the job's module with the test's own Python, as such an image would.
TORCH_IMAGE = "us-central1-docker.pkg.dev/test-project/nli/torch:test"
SUITE_APP = Path(__file__).resolve().parent / "vertex_suite_app.py"  # the suite image's entry point


@pytest.fixture(scope="module")
def fake(gcs_emulator: Dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeVertex]:
    image_dir = tmp_path_factory.mktemp("image")  # the image's WORKDIR; a job's relative paths land here
    job_env = {**gcs_emulator, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # jobs share the test's cores
    with FakeVertex(log_dir=tmp_path_factory.mktemp("job-logs"), job_env=job_env, pending_seconds=0.05,
                    cancel_grace_seconds=2.0) as fake:
        fake.job_env["SECRET_MANAGER_EMULATOR_HOST"] = fake.endpoint
        fake.add_image(IMAGE, entrypoint=[sys.executable, str(ROOT / "train.py")], workdir=image_dir)
        fake.add_image(SUITE_IMAGE, entrypoint=[sys.executable, str(SUITE_APP)],
                       workdir=image_dir)
        fake.add_image(CRASH_IMAGE, entrypoint=[sys.executable, "-c", CRASH], workdir=image_dir)
        fake.add_image(TPU_IMAGE, workdir=image_dir,
                       entrypoint=[sys.executable, str(ROOT / "train.py"), "--cfg", "job", "--package", "hw"])
        fake.add_secret(WANDB_SECRET.replace("latest", "1"), SENTINEL)
        yield fake


def launcher(fake: FakeVertex, image: str = IMAGE, hw: Optional[str] = "cpu") -> List[str]:
    """The launcher's settings for the fake (each one typed, whatever CLOUDSDK_COMPUTE_REGION or a
    conf/local/vertex.yaml of the checkout says), and the jobs' machine (the launcher refuses hw=auto); None:
    the caller names it, or the app has no hw group."""
    return ["hydra/launcher=vertex", f"hydra.launcher.project={PROJECT}", "hydra.launcher.region=us-central1",
            f"hydra.launcher.staging_bucket={BUCKET}", f"hydra.launcher.image_uri={image}",
            f"hydra.launcher.api_endpoint={fake.endpoint}", "hydra.launcher.poll_interval=0.1",
            *([f"hw={hw}"] if hw else [])]


@pytest.fixture
def sweep_train(hydra_restore_singletons: None, hydra_sweep_runner: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """An in-process `python train.py -m ARGS`, whose JobReturns the test reads."""
    GlobalHydra.instance().clear()  # conftest keeps Hydra initialised for compose(); restored after the test

    def run(overrides: List[str], sweep_dir: Path) -> Any:
        return hydra_sweep_runner(calling_file=str(ROOT / "train.py"), calling_module=None, task_function=None,
                                  config_path="conf", config_name="train", overrides=overrides, temp_dir=sweep_dir)

    yield run
    # A sweep whose job failed raised before its end, whose table the entry point prints (nli.cli.entry): ended here,
    # it is not printed by the next command this process runs, as if that command's.
    finish_open()


def sweep_cli(args: List[str], *, cwd: Path, env: Dict[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """`python train.py -m ARGS` as a user types it."""
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), "-m", *args], cwd=cwd,
                            env=process_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen)


def gcs_json(url: str) -> Dict[str, Any]:
    with fsspec.open(url) as stream:
        return json.load(stream)


def read_rows(sweep_dir: Path) -> List[Dict[str, str]]:
    with open(sweep_dir / "sweep_results.csv") as stream:
        return list(csv.DictReader(stream))


def created_jobs(fake: FakeVertex, since: int = 0) -> List[dict]:
    return [body for method, path, body in fake.requests[since:] if method == "POST" and path.split("?")[0]
            .endswith("/customJobs")]


# ------------------------------------------------------------------------------ sweeps of train.py


@pytest.mark.process
def test_sweep_of_two_jobs_returns_their_objectives_and_keeps_the_key_secret(
        fake: FakeVertex, sweep_train: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("WANDB_API_KEY", SENTINEL)  # the researcher's own key, in the launching shell
    before = len(fake.requests)
    overrides = [*launcher(fake), "hydra.launcher.sweep_name=two-jobs",
                 f"+hydra.launcher.secrets.WANDB_API_KEY={WANDB_SECRET}", *FAST, "logger=wandb",
                 "logger.wandb.mode=offline", "seed=1,2",
                 "hydra.launcher.prices.machines.n1-standard-8.on_demand=3600"]  # a dollar a second: cost_usd = seconds
    with sweep_train(overrides, tmp_path / "sweep") as sweep:
        returns = sweep.returns[0]
        rows = read_rows(tmp_path / "sweep")
        lines = (tmp_path / "sweep" / "sweep_results.jsonl").read_text().splitlines()
        local_files = [path for path in (tmp_path / "sweep").rglob("*") if path.is_file()]
        local_text = "".join(path.read_text(errors="replace") for path in local_files)

    assert [ret.status for ret in returns] == [JobStatus.COMPLETED, JobStatus.COMPLETED]
    assert [ret.overrides[-1] for ret in returns] == ["seed=1", "seed=2"]
    for num, ret in enumerate(returns):
        results = gcs_json(f"{BUCKET}/two-jobs/{num}/model/results.json")
        assert ret.return_value == results["objective"]  # what train.py returned, read back from the job
        assert 0 <= ret.return_value <= 1
        assert rows[num]["state"] == "COMPLETED" and rows[num]["vertex_state"] == "JOB_STATE_SUCCEEDED"
        assert float(rows[num]["objective"]) == results["objective"]
        assert rows[num]["seed"] == str(num + 1)
    assert [json.loads(line)["objective"] for line in lines] == [ret.return_value for ret in returns]

    requests = created_jobs(fake, before)
    assert [request["labels"]["seed"] for request in requests] == ["1", "2"]
    pool = requests[0]["jobSpec"]["workerPoolSpecs"][0]
    assert pool["containerSpec"]["args"][1:len(returns[0].overrides) + 1] == returns[0].overrides  # as written
    # The key reached each job only by reference, read from Secret Manager at the job's start ...
    assert fake.secret_accesses[-2:] == [WANDB_SECRET, WANDB_SECRET]
    # ... and its value is nowhere: not in a request, a job's environment or log, a local file, the bucket, the output.
    bucket = fsspec.filesystem("gcs")
    bucket.invalidate_cache()
    remote = [bucket.cat_file(path) for path in bucket.find(f"{BUCKET}/two-jobs")]
    jobs = [job for job in fake.jobs.values() if job.job.display_name.startswith("two-jobs")]
    assert len(jobs) == 2 and len(local_files) > 10 and len(remote) > 10
    # Each row's cost: its price per hour times the time Vertex AI ran it; no GPU-hours on hw=cpu.
    ran = {job.job.name: (job.job.end_time - job.job.start_time).total_seconds() for job in jobs}
    assert [float(row["cost_usd"]) for row in rows] == pytest.approx([ran[row["vertex_job"]] for row in rows], abs=1e-5)
    assert all(seconds > 0 for seconds in ran.values()) and "gpu_hours" not in rows[0]
    assert SENTINEL not in json.dumps(fake.requests[before:])
    assert not any(SENTINEL in json.dumps(job.env) or SENTINEL in job.log for job in jobs)
    assert SENTINEL not in local_text
    assert not any(SENTINEL.encode() in blob for blob in remote)
    out, err = capfd.readouterr()
    assert SENTINEL not in out + err + caplog.text
    assert "JOB_STATE_RUNNING" in caplog.text and "2 succeeded" in caplog.text  # what the researcher sees
    assert "estimated price: $7200.00/h for 2 jobs at once" in caplog.text
    assert f"The sweep used: estimated cost ${sum(float(row['cost_usd']) for row in rows):.2f} over 2 of 2 jobs" in \
        caplog.text


@pytest.mark.process
def test_a_failed_job_is_failed_with_vertex_message_and_the_other_succeeds(fake: FakeVertex, tmp_path: Path) -> None:
    # The second job's config is valid (the schema's rules pass every job before any is submitted) but it fails
    # inside the job: the parent of its checkpoint folder is a file.
    blocked = tmp_path / "a-file" / "checkpoints"
    blocked.parent.write_text("not a folder")
    proc = sweep_cli([*launcher(fake), *FAST, f"train.checkpoint_dir=null,{blocked}",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, output
    rows = read_rows(tmp_path / "sweep")
    assert [row["state"] for row in rows] == ["COMPLETED", "FAILED"]
    error = f"train.checkpoint_dir={blocked}: {blocked.parent} is a file, not a folder"
    assert error in rows[1]["error"]  # the job's own error, in its row
    assert 0 <= float(rows[0]["objective"]) <= 1 and rows[1]["objective"] == ""
    # Rows of this sweep (nli.sweep.table), hence in the table it prints at its end.
    assert rows[0]["sweep"] == rows[1]["sweep"] != "" and "1 of the sweep's jobs failed" in output
    assert "exited with a non-zero status of 1" in output  # the service's message ...
    assert error in output  # ... and the job's own error, reported from inside


@pytest.mark.process
def test_a_job_that_dies_before_reporting_shows_its_last_lines_from_cloud_logging(fake: FakeVertex,
                                                                                 tmp_path: Path) -> None:
    proc = sweep_cli([*launcher(fake, CRASH_IMAGE), "hydra.launcher.failed_log_lines=5",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, output
    shown = output[output.index("the last 2 lines of its output (Cloud Logging):"):].splitlines()
    assert [line.strip() for line in shown[1:3]] == ["loading the model", "Killed: out of memory (exit 137)"]
    assert "Traceback" not in output


@pytest.mark.process
def test_a_job_that_read_gs_and_failed_reports_its_own_error(fake: FakeVertex, tmp_path: Path) -> None:
    """The job reads gs:// (gcsfs caches a filesystem, whose session Python closes at exit) and ends with
    SystemExit: the callback reports at exit, after that close, and its report must still arrive."""
    proc = sweep_cli([*launcher(fake), "task=rte", "model=tiny", "data.dir=gs://test-bucket/glue_nope",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, output
    [row] = read_rows(tmp_path / "sweep")
    assert "; the job reported " in row["error"] and "glue_nope" in row["error"], row["error"]
    assert "does not exist" in row["error"]
    assert "Session is closed" not in output and "atexit" not in output, output
    [job] = [job for job in fake.jobs.values() if job.job.name in row["vertex_job"]]
    assert job.log.splitlines()[-1].startswith("error: data.dir=gs://test-bucket/glue_nope"), job.log  # its last


@pytest.mark.process
def test_a_job_that_dies_unreported_is_not_given_an_earlier_jobs_report(fake: FakeVertex, tmp_path: Path) -> None:
    """A sweep run again under its name: its job's folder in the bucket still holds the first attempt's report."""
    again = [f"hydra.launcher.sweep_name=again-{tmp_path.name}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    first = sweep_cli([*launcher(fake), "task=rte", "model=tiny", "data.dir=gs://test-bucket/glue_nope", *again],
                      cwd=tmp_path)
    output, _ = first.communicate(timeout=300)
    assert "; the job reported data.dir=gs://test-bucket/glue_nope" in output, output
    second = sweep_cli([*launcher(fake, CRASH_IMAGE), *again], cwd=tmp_path)
    output, _ = second.communicate(timeout=120)
    assert second.returncode == 1, output
    row = read_rows(tmp_path / "sweep")[-1]
    assert "exited with a non-zero status of 1" in row["error"] and "reported" not in row["error"], row["error"]
    assert "glue_nope" not in output.split("Killed: out of memory")[-1], output  # nor in the sweep's last words


def test_a_report_that_cannot_be_written_is_one_line(gcs_emulator: Dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from hydra_plugins.vertex_launcher._callback import _report
    from nli.contract import VERTEX_MODEL_DIR

    monkeypatch.setenv(VERTEX_MODEL_DIR, "gs://no-such-bucket/sweep/0/model/")
    _report({"status": "FAILED", "error": "the job's own"})
    err = capsys.readouterr().err
    assert err.startswith("error: could not write gs://no-such-bucket/sweep/0/model/job_return.json") and \
        err.count("\n") == 1, err


@pytest.mark.process
def test_logs_that_cannot_be_read_are_one_line_with_the_role(fake: FakeVertex, tmp_path: Path) -> None:
    fake.fail_next("entries", status=403, reason="PERMISSION_DENIED",
                   message=f"Permission 'logging.logEntries.list' denied on resource 'projects/{PROJECT}'.")
    proc = sweep_cli([*launcher(fake, CRASH_IMAGE), "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                     cwd=tmp_path)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, output  # the jobs failed; reading their logs did not fail the sweep
    assert output.count(f"Grant roles/logging.viewer on project {PROJECT}") == 1
    assert "Forbidden: 403" in output and "logging.logEntries.list" in output
    assert len(sweep_rows(tmp_path / "sweep")) == 2 and "Traceback" not in output


@pytest.mark.process
def test_stream_logs_follows_every_job_of_a_sweep_each_line_once_after_its_job(fake: FakeVertex,
                                                                              tmp_path: Path) -> None:
    before = set(fake.jobs)
    proc = sweep_cli([*launcher(fake), *FAST, "hydra.launcher.stream_logs=true", "seed=1,2",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    jobs = sorted((job for name, job in fake.jobs.items() if name not in before), key=lambda j: j.job.display_name)
    assert len(jobs) == 2
    for num, job in enumerate(jobs):
        prefix = f" seed={num + 1} | "  # the job's label: its number and overrides
        streamed = [line.split(prefix, 1)[1] for line in output.splitlines() if f"] #{num} " in line
                    and prefix in line]
        assert streamed == job.log.splitlines(), output  # every line of its output, in order, none twice
        assert any("step 12: loss=" in line for line in streamed)
        lines = output.splitlines()
        live = [i for i, line in enumerate(lines)
                if f"] #{num} " in line and prefix in line and "step 6: loss=" in line]
        ended = [i for i, line in enumerate(lines) if re.search(rf"] #{num} .*: JOB_STATE_SUCCEEDED", line)]
        assert live and ended and live[0] < ended[0], output  # printed as it came, not after the job's end


def sweep_rows(sweep_dir: Path) -> List[Dict[str, Any]]:
    from nli.sweep import table as sweep

    return sweep.read_rows(sweep_dir)


@pytest.mark.process
def test_ctrl_c_cancels_the_running_jobs(fake: FakeVertex, tmp_path: Path) -> None:
    before = set(fake.jobs)
    proc = sweep_cli([*launcher(fake), "experiment=quickstart", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                     cwd=tmp_path)
    try:
        fake.wait_for(lambda: [job.state for name, job in fake.jobs.items() if name not in before]
                      == [JobState.JOB_STATE_RUNNING] * 2, timeout=60)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    ours = [job for name, job in fake.jobs.items() if name not in before]
    assert proc.returncode == 130, output
    fake.wait_for(lambda: all(job.state is JobState.JOB_STATE_CANCELLED for job in ours), timeout=30)
    assert all(job.cancel_requested and job.process.poll() is not None for job in ours)
    for job in ours:
        assert f"cancelled {job.job.name}" in output


@pytest.mark.process
def test_optuna_drives_two_trials_through_vertex(fake: FakeVertex, tmp_path: Path) -> None:
    proc = sweep_cli([*launcher(fake), *FAST, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2",
                      "hydra.sweeper.n_jobs=2", "hydra.sweeper.direction=maximize",
                      "optimizer.lr=interval(0.0005, 0.005)",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    rows = read_rows(tmp_path / "sweep")
    best = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert len(rows) == 2 and all(row["state"] == "COMPLETED" for row in rows)
    assert best["best_value"] == max(float(row["objective"]) for row in rows)


@pytest.mark.process
def test_a_job_its_rules_refuse_is_not_submitted_and_the_others_run(fake: FakeVertex, sweep_train: Callable[..., Any],
                                                                    tmp_path: Path) -> None:
    """A sweeper that draws jobs after the command line's check (Hydra's own sweep runner here, as another sweeper
    would: the project's Optuna sweeper checks its trials itself) handed the launcher a job whose value the schema's
    rules refuse: it was submitted, and failed as it started, on a machine Vertex AI had started (and billed)."""
    before = len(fake.requests)
    refused = "not submitted to Vertex AI: the job would stop as it starts: optimizer.lr=-1.0 must be positive"
    with pytest.raises(JobFailed, match=refused):  # Hydra's sweeper raises its first failed job's error, once all ran
        with sweep_train([*launcher(fake), *FAST, "optimizer.lr=-1,0.001"], tmp_path / "sweep"):
            pass
    rows = read_rows(tmp_path / "sweep")
    (request,) = created_jobs(fake, before)  # the job of optimizer.lr=0.001 alone reached Vertex AI
    assert "optimizer.lr=0.001" in request["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"]
    assert [row["state"] for row in rows] == ["FAILED", "COMPLETED"] and rows[0]["optimizer.lr"] == "-1"
    assert rows[0]["error"] == f"{refused} (e.g. optimizer.lr=2e-5)" and 0 <= float(rows[1]["objective"]) <= 1


@pytest.mark.process
def test_a_search_that_would_not_wait_for_its_trials_is_refused_before_any_job(fake: FakeVertex,
                                                                               tmp_path: Path) -> None:
    before = len(fake.requests)
    proc = sweep_cli([*launcher(fake), *FAST, "hydra/sweeper=optuna", "hydra.launcher.wait=false",
                      "optimizer.lr=interval(0.0005, 0.005)", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, output
    assert output.strip().splitlines()[-1] == (
        "error: hydra.launcher.wait=false hands each job back as soon as it is submitted, and a search needs each "
        "trial's objective before it draws the next: drop it for a search")
    assert created_jobs(fake, before) == []


@pytest.mark.process
def test_a_search_in_a_dry_run_is_refused_before_its_study_records_a_trial(fake: FakeVertex, tmp_path: Path) -> None:
    """A dry run submits nothing: each trial "failed: None", recorded so in the study, which the real search then
    continued from there."""
    sweep_dir = tmp_path / "sweep"
    proc = sweep_cli([*launcher(fake), *FAST, "hparams_search=quickstart", "hydra.launcher.dry_run=true",
                      f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, output
    assert output.strip().splitlines()[-1] == (
        "error: hydra.launcher.dry_run=true submits nothing, so a search's trials would end without an objective, "
        "each recorded in the study as failed: dry-run the jobs of a list instead (drop hparams_search and "
        "hydra/sweeper, give each key one value or a list)")
    assert not (sweep_dir / "optuna.db").exists() and not (sweep_dir / "custom_jobs").exists()


@pytest.mark.process
def test_a_vertex_trial_is_pruned_through_its_folder_in_the_bucket(fake: FakeVertex, tmp_path: Path) -> None:
    """A Vertex AI job cannot reach the study's storage: its evaluations reach the sweeper through its model
    directory in the bucket, and the sweeper's prune.json reaches it there."""
    proc = sweep_cli([*launcher(fake), *FAST, "train.max_steps=200", "train.eval_every=10", "hydra/sweeper=optuna",
                      "hydra.sweeper.n_trials=1", "hydra.sweeper.direction=maximize", "hydra.sweeper.poll_interval=0.1",
                      "hydra/sweeper/pruner=threshold", "hydra.sweeper.pruner.lower=2.0",
                      "optimizer.lr=interval(0.0005, 0.005)", "hydra.launcher.sweep_name=pruned",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    (row,) = read_rows(tmp_path / "sweep")
    results = gcs_json(f"{BUCKET}/pruned/0/model/results.json")
    # Given up at step 10; the run reads prune.json right after writing each evaluation, so it ends at step 10
    # where the sweeper's poll falls in between (a CI run saw it), else at a later evaluation: never runs on.
    assert row["state"] == "PRUNED" and results["status"] == "pruned" and 10 <= results["pruned_at"] < 200
    assert gcs_json(f"{BUCKET}/pruned/0/model/prune.json")["step"] == 10
    assert "trial 0 (job 0) was pruned" in output


@pytest.mark.process
def test_tensorboard_events_reach_the_jobs_log_dir_and_its_vertex_tensorboard(fake: FakeVertex, tmp_path: Path) -> None:
    """The job writes its events locally and copies them to AIP_TENSORBOARD_LOG_DIR in the bucket, which
    the Vertex TensorBoard named on the CustomJob reads; the sweep prints where to look."""
    tensorboard = f"projects/{PROJECT}/locations/us-central1/tensorboards/123"
    before = len(fake.requests)
    proc = sweep_cli([*launcher(fake), *FAST, "logger=tensorboard", "hydra.launcher.sweep_name=tb",
                      f"hydra.launcher.tensorboard={tensorboard}",
                      "hydra.launcher.service_account=trainer@test-project.iam.gserviceaccount.com",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    (request,) = created_jobs(fake, before)
    assert request["jobSpec"]["tensorboard"] == tensorboard
    job_id = next(job.job.name for job in fake.jobs.values() if job.job.display_name.startswith("tb-0")).rsplit("/")[-1]
    assert (f"TensorBoard: https://us-central1.tensorboard.googleusercontent.com/experiment/projects+{PROJECT}"
            f"+locations+us-central1+tensorboards+123+experiments+{job_id}") in output
    bucket = fsspec.filesystem("gcs")
    bucket.invalidate_cache()
    logs = f"{BUCKET}/tb/0/logs"  # AIP_TENSORBOARD_LOG_DIR of the job's base output directory
    assert bucket.glob(f"{logs}/tensorboard/events.out.tfevents.*") and bucket.exists(f"{logs}/train.log")
    bucket.get(f"{logs}/tensorboard/", str(tmp_path / "events"), recursive=True)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "events"))
    events.Reload()
    assert [event.step for event in events.Scalars("eval/accuracy")] == [6, 12]
    assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")


def test_the_fake_refuses_a_tensorboard_without_a_service_account(fake: FakeVertex) -> None:
    """As Vertex AI does; the launcher checks it first (test_settings_are_checked_with_the_fix)."""
    from google.api_core.exceptions import BadRequest

    client = Vertex(VertexLauncherConf(project=PROJECT, staging_bucket=BUCKET, image_uri=IMAGE,
                                       api_endpoint=fake.endpoint)).client
    job = {"display_name": "tb", "job_spec": {"tensorboard": f"projects/{PROJECT}/locations/us-central1/tensorboards/1",
                                              "worker_pool_specs": [{"machine_spec": {"machine_type": "n1-standard-4"},
                                                                     "replica_count": 1,
                                                                     "container_spec": {"image_uri": IMAGE}}]}}
    with pytest.raises(BadRequest, match="A service account is required when a TensorBoard is set"):
        client.create_custom_job(parent=f"projects/{PROJECT}/locations/us-central1", custom_job=job)


@pytest.mark.process
def test_python_package_job_runs_the_sdist(fake: FakeVertex, sweep_train: Callable[..., Any], tmp_path: Path) -> None:
    """No image of ours: the launcher builds the project's sdist, uploads it, and the job pip-installs it and
    runs `python -m nli` on a stock image, so the sdist must carry the config."""
    overrides = [*launcher(fake), "hydra.launcher.packaging=python_package", "hydra.launcher.sweep_name=package",
                 f"hydra.launcher.executor_image_uri={TORCH_IMAGE}",
                 f"hydra.launcher.source_dir={ROOT}", *FAST]
    with sweep_train(overrides, tmp_path / "sweep") as sweep:
        ret = sweep.returns[0][0]
        sdists = list((tmp_path / "sweep" / "code").glob("*.tar.gz"))
    job = next(job for job in fake.jobs.values() if job.job.display_name.startswith("package-0"))
    spec = job.job.job_spec.worker_pool_specs[0]
    assert ret.status is JobStatus.COMPLETED, ret._return_value
    assert ret.return_value == gcs_json(f"{BUCKET}/package/0/model/results.json")["objective"]
    assert [Path(uri).name for uri in spec.python_package_spec.package_uris] == [sdists[0].name]
    assert spec.python_package_spec.python_module == "nli.node"


# ------------------------------------------------------------------------------ before anything runs


@pytest.mark.process
def test_dry_run_writes_the_requests_with_the_seeds_machines(fake: FakeVertex, tmp_path: Path) -> None:
    before = len(fake.requests)
    spot_prices = ["hydra.launcher.prices.machines.n1-standard-8.spot=0.1", "hydra.launcher.prices.machines.a2-highgpu-"
                   "8g.spot=1.0", *(f"hydra.launcher.prices.accelerators.NVIDIA_TESLA_{gpu}.spot={price}"
                                    for gpu, price in (("V100", 0.7), ("A100", 1.2)))]
    proc = sweep_cli([*launcher(fake, hw=None), "hydra.launcher.dry_run=true", "hw=v100,8xa100", "optimizer.lr=2e-5",
                      "hydra.launcher.strategy=SPOT", "hydra.launcher.timeout=3600", "+hydra.launcher.labels.team=nlp",
                      *spot_prices, f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path,
                     env={"PYTHONPROFILEIMPORTTIME": "1"})
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert len(fake.requests) == before  # nothing submitted
    # The launching process trains nothing: it loads no torch (2 s of each sweep's start on this machine).
    assert not re.search(r"\|\s+torch$", output, re.MULTILINE), "launching the sweep imported torch"
    requests = [json.loads((tmp_path / "sweep" / "custom_jobs" / f"{num}.json").read_text()) for num in (0, 1)]
    machines = [request["customJob"]["jobSpec"]["workerPoolSpecs"][0]["machineSpec"] for request in requests]
    assert machines == [
        {"machineType": "n1-standard-8", "acceleratorType": "NVIDIA_TESLA_V100", "acceleratorCount": 1},
        {"machineType": "a2-highgpu-8g", "acceleratorType": "NVIDIA_TESLA_A100", "acceleratorCount": 8}]
    job = requests[1]["customJob"]
    assert requests[1]["parent"] == f"projects/{PROJECT}/locations/us-central1"
    assert (job["labels"]["hw"], job["labels"]["optimizer_lr"], job["labels"]["team"]) == ("8xa100", "2e-05", "nlp")
    assert job["jobSpec"]["scheduling"] == {"strategy": "SPOT", "timeout": "3600s"}
    sweep_name = job["labels"]["hydra_sweep"]
    assert job["jobSpec"]["baseOutputDirectory"]["outputUriPrefix"] == f"{BUCKET}/{sweep_name}/1"
    assert job["displayName"] != requests[0]["customJob"]["displayName"]
    args = job["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"]
    assert args[:3] == ["--config-name=train", "hw=8xa100", "optimizer.lr=2e-05"]  # as the sweeper wrote it
    # On Spot VMs, by hand: hw=v100 0.1 + 0.7, hw=8xa100 1.0 + 8 x 1.2; both at once, each for at most an hour.
    assert ("estimated price: $11.40/h for 2 jobs at once (up to max_concurrent_jobs=16), ceiling $11.40 if every job "
            "ran to its timeout (1h); prices of us-central1 read on ") in output


@pytest.mark.process
def test_wandb_online_without_a_secret_fails_before_submitting(fake: FakeVertex, tmp_path: Path) -> None:
    before = len(fake.requests)
    proc = sweep_cli([*launcher(fake), *FAST, "logger=wandb", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                     cwd=tmp_path, env={"WANDB_API_KEY": SENTINEL})
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "gcloud secrets create wandb-api-key" in output and "hydra.launcher.secrets" in output
    assert len(fake.requests) == before and SENTINEL not in output


@pytest.mark.process
def test_a_secret_in_env_is_refused_before_hydra_saves_the_config(fake: FakeVertex, tmp_path: Path) -> None:
    proc = sweep_cli([*launcher(fake), *FAST, f"+hydra.launcher.env.TOKEN={SENTINEL}", "seed=1,2",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env={"WANDB_API_KEY": SENTINEL})
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "hydra.launcher.env.TOKEN would put a secret" in output
    assert not (tmp_path / "sweep" / "multirun.yaml").exists()


@pytest.mark.process
def test_a_staging_bucket_that_does_not_exist_stops_the_sweep_before_any_job(fake: FakeVertex, tmp_path: Path) -> None:
    before = len(fake.requests)
    proc = sweep_cli([*launcher(fake), "hydra.launcher.staging_bucket=gs://no-such-bucket/sweeps", "seed=1,2",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, output
    assert created_jobs(fake, before) == []
    assert "error: hydra.launcher.staging_bucket=gs://no-such-bucket/sweeps: bucket no-such-bucket does not exist " \
           "(create it: gcloud storage buckets create gs://no-such-bucket); nothing was built or submitted" \
           in output.splitlines(), output
    assert "could not be written" not in output and "Traceback" not in output, output


BLOCKED_IMPORT = """
import runpy, sys
sys.modules[sys.argv[1]] = None  # as if not installed: importing it raises ImportError naming it
sys.argv = ["train.py", *sys.argv[2:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.process
@pytest.mark.parametrize("missing", ["google.cloud.aiplatform_v1", "hydra_plugins.vertex_launcher._git"])
def test_only_googles_client_missing_is_told_to_install_the_extra(fake: FakeVertex, tmp_path: Path,
                                                                  missing: str) -> None:
    """pip install 'nli-glue[vertex]' fixes Google's client missing, and only that: a module of the launcher's own
    that cannot be imported (a broken checkout) surfaces as its traceback, not as advice to install the extra."""
    proc = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT, missing, "-m", *launcher(fake), *FAST,
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=ROOT, env=process_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    install = "error: hydra/launcher=vertex needs Google's Vertex AI client"
    if missing.startswith("google."):
        assert proc.stderr.startswith(install) and "pip install 'nli-glue[vertex]'" in proc.stderr, proc.stderr
    else:
        assert install not in proc.stderr and f"ModuleNotFoundError: import of {missing} halted" in proc.stderr


@pytest.mark.process
def test_permission_denied_stops_the_sweep_with_the_fix(fake: FakeVertex, tmp_path: Path) -> None:
    fake.fail_next("create", status=403, reason="PERMISSION_DENIED",
                   message=f"Permission 'aiplatform.customJobs.create' denied on resource '//aiplatform.googleapis.com/"
                           f"projects/{PROJECT}/locations/us-central1' (or it may not exist).")
    proc = sweep_cli([*launcher(fake), *FAST, "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "aiplatform.customJobs.create' denied" in output and "roles/aiplatform.user" in output


# ------------------------------------------------------------------------------ TPUs


@pytest.mark.process
def test_dry_run_asks_for_each_tpu_preset_as_vertex_names_it(fake: FakeVertex, tmp_path: Path) -> None:
    """v5e by topology on a TPU VM, one host each (v2/v3, by accelerator on cloud-tpu, cannot train yet:
    test_vertex_day_one.py); a CPU job's spec keeps its machine type alone (the GPU presets:
    test_dry_run_writes_the_requests_with_the_seeds_machines)."""
    before = len(fake.requests)
    presets = ["tpu-v5e-1", "tpu-v5e-8", "cpu"]
    proc = sweep_cli([*launcher(fake, hw=None), "hydra.launcher.dry_run=true", f"hw={','.join(presets)}",
                      f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert len(fake.requests) == before
    requests = [json.loads((tmp_path / "sweep" / "custom_jobs" / f"{num}.json").read_text())
                for num in range(len(presets))]
    pools = [request["customJob"]["jobSpec"]["workerPoolSpecs"] for request in requests]
    assert [len(job_pools) for job_pools in pools] == [1] * len(presets)
    assert [job_pools[0]["machineSpec"] for job_pools in pools] == [
        {"machineType": "ct5lp-hightpu-1t", "tpuTopology": "1x1"},
        {"machineType": "ct5lp-hightpu-8t", "tpuTopology": "2x4"},
        {"machineType": "n1-standard-8"}]


@pytest.mark.process
def test_a_tpu_sweep_reaches_vertex_with_its_topology(fake: FakeVertex, sweep_train: Callable[..., Any],
                                                     tmp_path: Path) -> None:
    """Through the aiplatform client to the service: each v5e job's topology; each job starts the image with
    its own TPU preset."""
    before = len(fake.requests)
    overrides = [*launcher(fake, TPU_IMAGE, hw=None), "hydra.launcher.sweep_name=tpus", "hw=tpu-v5e-8,tpu-v5e-1"]
    with sweep_train(overrides, tmp_path / "sweep") as sweep:
        returns = sweep.returns[0]
    assert [ret.status for ret in returns] == [JobStatus.COMPLETED] * 2
    sent = [request["jobSpec"]["workerPoolSpecs"][0]["machineSpec"] for request in created_jobs(fake, before)]
    assert sent == [{"machineType": "ct5lp-hightpu-8t", "tpuTopology": "2x4"},
                    {"machineType": "ct5lp-hightpu-1t", "tpuTopology": "1x1"}]
    jobs = sorted((job for job in fake.jobs.values() if job.job.display_name.startswith("tpus-")),
                  key=lambda job: job.job.display_name)
    machines = [job.job.job_spec.worker_pool_specs[0].machine_spec for job in jobs]  # as the service parsed them
    assert [(m.machine_type, m.tpu_topology, m.accelerator_type, m.accelerator_count) for m in machines] == [
        ("ct5lp-hightpu-8t", "2x4", AcceleratorType.ACCELERATOR_TYPE_UNSPECIFIED, 0),
        ("ct5lp-hightpu-1t", "1x1", AcceleratorType.ACCELERATOR_TYPE_UNSPECIFIED, 0)]
    assert [job.state for job in jobs] == [JobState.JOB_STATE_SUCCEEDED] * 2
    hws = [yaml.safe_load(job.log) for job in jobs]  # the hw config each job composed from its arguments
    assert [(hw["accelerator"], hw["tpu"], hw["tpu_devices"]) for hw in hws] == [("xla", "v5e", 8), ("xla", "v5e", 1)]


@pytest.mark.parametrize("overrides, message", [
    pytest.param(["hw=v100,tpu-v5e-8", "hw.nodes=2"],  # the GPU job alone would go: the sweep stops whole
                 re.escape("hw.nodes=2 with a TPU (machine type ct5lp-hightpu-8t): this launcher runs a TPU job on "
                           "one host and builds no multi-host slices; set hw.nodes=1"), id="nodes"),
    pytest.param(["hw=tpu-v3-8", "hydra.launcher.reduction_server_replicas=4"],
                 "reduction_server_replicas=4 with a TPU .*; set hydra.launcher.reduction_server_replicas=0",
                 id="reduction-server"),
    pytest.param(["hw=tpu-v5e-8", "hydra.launcher.packaging=python_package"],
                 "packaging=python_package with a TPU .* have no torch-xla; build the TPU image "
                 r"\(docker build --target tpu", id="python-package"),
    pytest.param(["hw=tpu-v3-8", "hw.vertex.accelerator_count=4"],
                 "machine type cloud-tpu needs hw.vertex.accelerator_type=TPU_V2 or TPU_V3 and "
                 "hw.vertex.accelerator_count=8, not TPU_V3 x 4", id="cloud-tpu-count"),
    pytest.param(["hw=cpu", "hw.vertex.machine_type=cloud-tpu"], "machine type cloud-tpu needs .*, not none",
                 id="cloud-tpu-bare"),
    pytest.param(["hw=tpu-v3-8", "hw.vertex.tpu_topology=2x4"], "machine type cloud-tpu takes no tpu_topology",
                 id="cloud-tpu-topology"),
    pytest.param(["hw=tpu-v5e-8", "hw.vertex.tpu_topology=2x2"],
                 r"machine type ct5lp-hightpu-8t needs hw.vertex.tpu_topology=2x4 \(as many chips .*\), not 2x2",
                 id="v5e-chips"),
    pytest.param(["hw=tpu-v5e-1", "hw.vertex.tpu_topology=null"],
                 "machine type ct5lp-hightpu-1t needs hw.vertex.tpu_topology=1x1 .*, not none", id="v5e-no-topology"),
    pytest.param(["hw=tpu-v5e-8", "hw.vertex.accelerator_type=TPU_V5_LITEPOD", "hw.vertex.accelerator_count=8"],
                 "ct5lp-hightpu-8t is a TPU VM, .* takes no accelerator, not TPU_V5_LITEPOD x 8", id="v5e-accelerator"),
    pytest.param(["hw=v100", "hw.vertex.tpu_topology=2x4"],
                 "hw.vertex.tpu_topology=2x4 on machine type n1-standard-8: only the TPU VM machine types",
                 id="gpu-topology"),
    pytest.param(["hw=tpu-v3-8", "hw.vertex.machine_type=n1-standard-8"],
                 "hw.vertex.accelerator_type=TPU_V3 on machine type n1-standard-8: TPU v2 and v3 run on machine type "
                 "cloud-tpu", id="tpu-on-n1"),
])
def test_tpu_settings_vertex_refuses_or_that_cannot_run_stop_the_sweep_before_submitting(
        fake: FakeVertex, sweep_train: Callable[..., Any], tmp_path: Path, overrides: List[str], message: str) -> None:
    before = len(fake.requests)
    with pytest.raises(Refused, match=message) as refused:  # `error: <it>` on stderr, exit status 1
        with sweep_train([*launcher(fake, hw=None), *overrides], tmp_path / "sweep"):
            pass
    assert "\n" not in str(refused.value)  # one line: the setting and its fix
    assert len(fake.requests) == before  # not one call reached the service
    assert not (tmp_path / "sweep" / "code").exists()  # python_package: no sdist built either


# ------------------------------------------------------------------------------ the client


def client(fake: FakeVertex) -> Vertex:
    return Vertex(VertexLauncherConf(project=PROJECT, staging_bucket=BUCKET, image_uri=IMAGE,
                                     api_endpoint=fake.endpoint))


def small_job(name: str) -> Dict[str, Any]:
    command = [sys.executable, "-c", "pass"]
    return {"display_name": name, "job_spec": {"worker_pool_specs": [{
        "machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
        "container_spec": {"image_uri": IMAGE, "command": command}}]}}


def sweep_job(name: str, num: int = 0) -> Dict[str, Any]:
    """A job as the launcher submits it: labelled with its sweep's id and its number, which find it again."""
    return {**small_job(name), "labels": {"hydra_sweep_id": name, "hydra_job": str(num)}}


def test_transient_errors_are_retried(fake: FakeVertex) -> None:
    fake.fail_next("create", status=503, reason="UNAVAILABLE", message="The service is currently unavailable.", times=2)
    fake.fail_next("get", status=429, reason="RESOURCE_EXHAUSTED", message="Too many requests, slow down.")
    vertex = client(fake)
    job = vertex.create(sweep_job("retried"))
    assert vertex.get(job.name).display_name == "retried"


class CreatedThenFailed:
    """The service made the job, then its reply was lost: a 5xx or a timeout on the way back. Once."""

    def __init__(self, fake: FakeVertex, status: int, reason: str) -> None:
        self.fake, self.status, self.reason, self.armed = fake, status, reason, True

    def __call__(self, method: str, path: str, body: bytes) -> Optional[Tuple[int, dict]]:
        if not (self.armed and method == "POST" and path.split("?")[0].endswith("/customJobs")):
            return None
        self.armed = False
        assert self.fake.handle(method, path, body)[0] == 200
        return ApiError(self.status, self.reason, "The service had a problem; the outcome is unknown.").reply()


@pytest.mark.parametrize("status, reason", [(500, "INTERNAL"), (504, "DEADLINE_EXCEEDED")])
def test_a_create_whose_reply_is_lost_adopts_the_job_it_made(fake: FakeVertex, status: int, reason: str) -> None:
    fake.mount(CreatedThenFailed(fake, status, reason))
    sweep_id = f"lost-{status}"
    job = client(fake).create(sweep_job(sweep_id, num=3))
    made = [name for name, each in fake.jobs.items() if each.job.labels.get("hydra_sweep_id") == sweep_id]
    assert made == [job.name]  # one job, not two, and the one the sweep follows (and Ctrl-C cancels)


def test_quota_and_invalid_requests_are_not_retried(fake: FakeVertex) -> None:
    vertex = client(fake)
    before = len(created_jobs(fake))
    fake.fail_next("create", status=429, reason="RESOURCE_EXHAUSTED", message="The following quota metrics exceed "
                   "quota limits: aiplatform.googleapis.com/custom_model_training_nvidia_a100_gpus")
    with pytest.raises(LaunchError, match="(?s)custom_model_training_nvidia_a100_gpus.*Ask for more quota"):
        vertex.create(small_job("quota"))  # a retry would have succeeded
    job = small_job("bad label")
    job["labels"] = {"Optimizer.LR": "x"}
    with pytest.raises(LaunchError, match="(?s)Optimizer.LR.*dry_run=true"):
        vertex.create(job)
    assert len(created_jobs(fake)) == before + 2


# ------------------------------------------------------------------------------ Hydra's own launcher suites


@pytest.fixture
def _suite_hydra(hydra_restore_singletons: None) -> None:
    """Hydra as a fresh process has it for the suites, which initialise it themselves and declare no
    version_base (so Hydra 1.1's defaults hold, such as changing into the job's directory)."""
    GlobalHydra.instance().clear()
    VersionBase.instance().setbase(version.__compat_version__)


@pytest.fixture
def launcher_name() -> str:
    return "vertex_base"  # the plugin's own config: the suites' apps have no conf/hydra/launcher/vertex.yaml


@pytest.fixture
def overrides(fake: FakeVertex) -> List[str]:
    return launcher(fake, SUITE_IMAGE, hw=None)[1:]


@pytest.mark.process
@pytest.mark.usefixtures("_suite_hydra")
class TestVertexLauncher(LauncherTestSuite):
    pass


@pytest.fixture
def task_launcher_cfg(fake: FakeVertex, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    return {"defaults": [{"override hydra/launcher": "vertex_base"}],
            "hydra": {"launcher": {"project": PROJECT, "staging_bucket": BUCKET, "image_uri": APP_IMAGE,
                                   "api_endpoint": fake.endpoint, "poll_interval": 0.1}}}


@pytest.fixture
def extra_flags() -> List[str]:
    return ["-m"]


@pytest.mark.process
@pytest.mark.process
@pytest.mark.usefixtures("_suite_hydra")
class TestVertexLauncherIntegration(IntegrationTestSuite):
    """The suite writes a small app into a scratch directory and runs it with `-m`; on Vertex its jobs run that
    app as an image would: the same script, in the same directory."""

    @pytest.fixture(autouse=True)
    def _image(self, fake: FakeVertex) -> Iterator[None]:
        self.fake = fake
        yield

    def get_test_scratch_dir(self, tmpdir: Path) -> Path:
        self.scratch = Path(tmpdir)
        return Path(tmpdir)

    def generate_custom_cmd(self) -> Callable[..., List[str]]:
        def image_of(cmd: List[str], filename: str) -> List[str]:
            self.fake.add_image(APP_IMAGE, entrypoint=[sys.executable, filename], workdir=self.scratch)
            return cmd

        return image_of


def test_the_suite_app_is_what_the_suite_expects() -> None:
    """The image for LauncherTestSuite answers as the suite's own task functions do."""
    proc = subprocess.run([sys.executable, str(SUITE_APP), "--config-name=compose",
                           "--cfg", "job"], capture_output=True, text=True, timeout=60)
    assert OmegaConf.create(proc.stdout) == {"foo": 10, "bar": 100}


@pytest.mark.process
def test_wait_false_submits_and_returns(fake: FakeVertex, _suite_hydra: None,
                                        hydra_sweep_runner: Callable[..., Any], tmp_path: Path) -> None:
    before = set(fake.jobs)
    with hydra_sweep_runner(calling_file=None, calling_module="hydra.test_utils.a_module", task_function=None,
                            config_path="configs", config_name="compose",
                            overrides=["hydra/launcher=vertex_base", *launcher(fake, SUITE_IMAGE, hw=None)[1:],
                                       "hydra.launcher.wait=false", "+a=1,2"],
                            temp_dir=tmp_path / "sweep") as sweep:
        returns = sweep.returns[0]
    ours = [job for name, job in fake.jobs.items() if name not in before]
    assert [ret.status for ret in returns] == [JobStatus.COMPLETED] * 2
    assert [ret.return_value for ret in returns] == [None, None]  # results come later, in each job's output
    assert len(ours) == 2
    fake.wait_for(lambda: all(job.state is JobState.JOB_STATE_SUCCEEDED for job in ours), timeout=60)


@pytest.mark.parametrize("override, key, value", [
    ("optimizer.lr=1e-05", "optimizer_lr", "1e-05"),
    ("+data.files.train=/data/Train.CSV", "data_files_train", "_data_train_csv"),
    ("model=roberta-large", "model", "roberta-large"),
])
def test_labels_follow_googles_rules(override: str, key: str, value: str) -> None:
    found = labels("Sweep:2026-11-23", 3, [override], {"1st": "Yes"})
    assert found == {"hydra_sweep": "sweep_2026-11-23", "hydra_job": "3", key: value, "k1st": "yes"}


def test_at_most_64_labels_and_63_characters() -> None:
    found = labels("s" * 100, 0, [f"+k{i}={'v' * 80}" for i in range(80)], {"team": "nlp"})
    assert len(found) == 64 and found["team"] == "nlp"
    assert all(len(k) <= 63 and len(v) <= 63 for k, v in found.items())


def test_a_run_dir_stays_one_value() -> None:
    """Hydra would read `a=1,b=2` as a sweep; quoted, the job's run directory is one string."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = "dir/a=1,b=2/it's"
    assert OverridesParser.create().parse_override("hydra.run.dir=" + quote(path)).value() == path


@pytest.mark.process
def test_discovery_stays_light() -> None:
    """Hydra imports every plugin at start (`--help` too): the Vertex client loads only when a sweep launches."""
    code = ("import sys; from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; "
            "names = [c.__name__ for c in Plugins.instance().discover(Launcher)]; "
            "print('VertexLauncher' in names, any(m.startswith('google.cloud.aiplatform') for m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["True", "False"], proc.stderr


@pytest.mark.parametrize("change, message", [
    ({"project": None}, "hydra.launcher.project is not set"),
    ({"staging_bucket": None}, "hydra.launcher.staging_bucket is not set"),
    ({"staging_bucket": "my-bucket"}, "is not a gs:// path"),
    ({"staging_bucket": "gs://"}, "names no bucket"),
    ({"staging_bucket": "gs:///sweeps"}, "names no bucket"),
    ({"image_uri": None}, "hydra.launcher.image_uri is not set"),
    ({"secrets": {"WANDB_API_KEY": "wandb-api-key"}}, "is not a Secret Manager version"),
    ({"env": {"WANDB_API_KEY": "abc"}}, "hydra.launcher.env.WANDB_API_KEY would put a secret"),
    ({"failed_log_lines": -1}, "failed_log_lines >= 0"),
    ({"timeout": -5}, r"hydra.launcher.timeout=-5 must be a positive number of seconds, or null"),
    ({"tensorboard": "my-tensorboard"}, "is not a TensorBoard's resource name"),
    ({"tensorboard": f"projects/{PROJECT}/locations/europe-west4/tensorboards/1", "service_account": "a@b"},
     "is in europe-west4 and the jobs run in us-central1"),
    ({"tensorboard": f"projects/{PROJECT}/locations/us-central1/tensorboards/1"},
     "hydra.launcher.tensorboard needs hydra.launcher.service_account"),
])
def test_settings_are_checked_with_the_fix(change: Dict[str, Any], message: str) -> None:
    from hydra_plugins.vertex_launcher._checks import check_settings

    good = {"project": PROJECT, "staging_bucket": BUCKET, "image_uri": IMAGE}
    check_settings(VertexLauncherConf(**good))
    with pytest.raises(LaunchError, match=message):
        check_settings(VertexLauncherConf(**{**good, **change}))


@pytest.mark.process
def test_a_sweep_dir_outside_the_working_dir_is_sent_as_a_folder_the_job_can_make(fake: FakeVertex,
                                                                                 tmp_path: Path) -> None:
    """The image runs as an unprivileged user who can make folders only under its WORKDIR: an absolute
    hydra.run.dir there (this machine's path) would fail before the job's callback could report anything."""
    (tmp_path / "work").mkdir()
    proc = sweep_cli([*launcher(fake), "hydra.launcher.dry_run=true", f"hydra.sweep.dir={tmp_path / 'elsewhere'}"],
                     cwd=tmp_path / "work")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    request = json.loads((tmp_path / "elsewhere" / "custom_jobs" / "0.json").read_text())
    args = request["customJob"]["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"]
    assert "hydra.run.dir='elsewhere/0'" in args, args  # the sweep's folder name and the job's subfolder


@pytest.mark.process
def test_dry_run_of_two_nodes_with_reduction_server(fake: FakeVertex, tmp_path: Path) -> None:
    """hw=2x8xa100 and four Reduction Server replicas: the three worker pools of Google's sample."""
    proc = sweep_cli([*launcher(fake, hw=None), "hydra.launcher.dry_run=true", "hw=2x8xa100",
                      "hydra.launcher.reduction_server_replicas=4", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                     cwd=tmp_path)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    request = json.loads((tmp_path / "sweep" / "custom_jobs" / "0.json").read_text())
    pools = request["customJob"]["jobSpec"]["workerPoolSpecs"]
    gpus = {"machineType": "a2-highgpu-8g", "acceleratorType": "NVIDIA_TESLA_A100", "acceleratorCount": 8}
    assert [pool["machineSpec"] for pool in pools] == [gpus, gpus, {"machineType": "n1-highcpu-16"}]
    assert [pool["replicaCount"] for pool in pools] == ["1", "1", "4"]
    assert pools[0]["containerSpec"] == pools[1]["containerSpec"]  # every node runs the same code
    assert pools[2]["containerSpec"]["imageUri"].endswith("/reductionserver:latest")
