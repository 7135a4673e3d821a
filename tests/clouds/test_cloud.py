"""``python -m nli.cloud attach|cancel|logs SWEEP`` (nli/sweep/vertex.py): a Vertex AI sweep launched without
waiting, found again from the record its launcher wrote, through the real google-cloud-aiplatform client
and the fake Vertex AI service (tests/clouds/fake_vertex.py), which runs each job of train.py as Vertex runs a
container, with the Cloud Storage emulator as the staging bucket."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Iterator, List

import pytest
from google.cloud.aiplatform_v1 import JobState
from hydra.core.global_hydra import GlobalHydra

from nli.io.storage import Storage
from nli.sweep import report
from nli.sweep import table as sweep
from nli.sweep import vertex as cloud
from tests.clouds.fake_vertex import FakeVertex
from tests.clouds.test_vertex import BUCKET, IMAGE, gcs_json, launcher, read_rows, sweep_cli
from tests.support.runs import FAST, ROOT, process_env, read_line
from tests.sweeps.test_report import tables

NOT_WAITING = ["hydra.launcher.wait=false", "seed=1,2"]
Submit = Callable[[List[str], Path], ContextManager[List[str]]]


@pytest.fixture(scope="module")
def vertex(gcs_emulator: Dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeVertex]:
    """The fake service, whose jobs run train.py in a folder of their own (the image's WORKDIR)."""
    job_env = {**gcs_emulator, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with FakeVertex(log_dir=tmp_path_factory.mktemp("job-logs"), job_env=job_env, pending_seconds=0.05,
                    cancel_grace_seconds=2.0) as fake:
        fake.add_image(IMAGE, entrypoint=[sys.executable, str(ROOT / "train.py")],
                       workdir=tmp_path_factory.mktemp("image"))
        yield fake


@pytest.fixture
def submit(vertex: FakeVertex, hydra_restore_singletons: None,
           hydra_sweep_runner: Callable[..., Any]) -> Submit:
    """``with submit(overrides, sweep_dir) as names``: `train.py -m` launched with hydra.launcher.wait=false in
    this process, and the new jobs' resource names; the sweep's folder is there until the block ends."""
    GlobalHydra.instance().clear()  # conftest keeps Hydra initialised for compose(); restored after the test

    @contextmanager
    def run(overrides: List[str], sweep_dir: Path) -> Iterator[List[str]]:
        before = set(vertex.jobs)
        with hydra_sweep_runner(calling_file=str(ROOT / "train.py"), calling_module=None, task_function=None,
                                config_path="conf", config_name="train", temp_dir=sweep_dir,
                                overrides=[*launcher(vertex), *overrides, *NOT_WAITING]):
            yield [name for name in vertex.jobs if name not in before]

    return run


def ours(vertex: FakeVertex, names: List[str]) -> List[Any]:
    return [vertex.jobs[name] for name in names]


# ------------------------------------------------------------------------------------- attach


@pytest.mark.process
def test_attach_follows_a_sweep_that_did_not_wait_and_fills_its_table(
        vertex: FakeVertex, submit: Submit, tmp_path: Path, gcs_emulator: Dict[str, str],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    sweep_dir = tmp_path / "sweep"
    with submit([*FAST, "hydra.launcher.sweep_name=attached"], sweep_dir) as names:
        attach_and_report(vertex, names, sweep_dir, tmp_path, capsys, monkeypatch)


def attach_and_report(vertex: FakeVertex, names: List[str], sweep_dir: Path, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    record = json.loads((sweep_dir / "vertex_jobs.json").read_text())
    assert [job["name"] for job in record["jobs"]] == names and len(names) == 2
    assert gcs_json(f"{BUCKET}/attached/vertex_jobs.json") == record  # found from another machine too
    assert sweep.read_rows(sweep_dir) == []  # nothing ended while the launcher was there
    # As a launcher killed between Vertex AI's answer and the record's next write leaves it: the second job
    # runs, unnoted. attach finds it by the sweep's label rather than call it never submitted.
    (sweep_dir / "vertex_jobs.json").write_text(json.dumps({**record, "jobs": record["jobs"][:1]}))
    labels = vertex.jobs[names[1]].job.labels
    assert (labels["hydra_sweep_id"], labels["hydra_job"]) == (record["stamp"]["sweep"], "1")
    capsys.readouterr()

    assert cloud.main(["attach", str(sweep_dir), "--logs", "0"]) == 0
    out = capsys.readouterr().out
    assert "never submitted" not in out
    rows = sorted(read_rows(sweep_dir), key=lambda row: int(row["job"]))  # each added as its job ended
    assert [(row["job"], row["state"], row["vertex_state"], row["seed"]) for row in rows] == [
        ("0", "COMPLETED", "JOB_STATE_SUCCEEDED", "1"), ("1", "COMPLETED", "JOB_STATE_SUCCEEDED", "2")]
    for num, row in enumerate(rows):  # the launcher's own rows: the jobs' results, read back from the bucket
        assert float(row["objective"]) == gcs_json(f"{BUCKET}/attached/{num}/model/results.json")["objective"]
        assert row["sweep"] == record["stamp"]["sweep"] and row["vertex_job"] == names[num]
        assert row["image"].startswith(f"{IMAGE}@sha256:")  # what it ran, as a waiting sweep's row says
        assert re.search(f"^#{num} .*seed={num + 1}: JOB_STATE_SUCCEEDED https://console.cloud.google.com/vertex-ai/",
                         out, re.MULTILINE)
    assert any(line.startswith("#0 | ") and "step 12: loss=" in line for line in out.splitlines())
    assert not any(line.startswith("#1 | ") for line in out.splitlines())  # only the job asked for

    assert cloud.main(["attach", str(sweep_dir)]) == 0  # again: every job has ended; nothing is added
    assert len(sweep.read_rows(sweep_dir)) == 2
    assert cloud.main(["logs", str(sweep_dir), "--job", "1"]) == 0
    assert "step 12: loss=" in capsys.readouterr().out
    # An hour later: the sweep and its jobs' output are as old, and the log is read from the sweep's start.
    aged = json.loads((sweep_dir / "vertex_jobs.json").read_text())
    aged["stamp"]["sweep_started"] -= 3600
    (sweep_dir / "vertex_jobs.json").write_text(json.dumps(aged))
    for name in names:
        vertex.jobs[name].job.start_time = vertex.jobs[name].job.start_time - timedelta(hours=1)
    assert cloud.main(["logs", str(sweep_dir), "--job", "1"]) == 0
    assert "step 12: loss=" in capsys.readouterr().out

    # From the bucket alone: the table goes there, and the report reads it.
    assert cloud.main(["attach", f"{BUCKET}/attached"]) == 0
    assert len(Storage(f"{BUCKET}/attached").read_bytes("sweep_results.csv").decode().splitlines()) == 3
    monkeypatch.chdir(tmp_path)
    assert report.main([f"{BUCKET}/attached"]) == 0
    jobs = tables((tmp_path / "reports" / "attached" / "report.md").read_text())["Jobs"]
    assert [(job["seed"], float(job["objective"])) for job in jobs] == [
        (row["seed"], pytest.approx(float(row["objective"]), abs=1e-4)) for row in rows]  # 4 decimals


@pytest.mark.process
def test_ctrl_c_detaches_and_cancel_cancels_the_unfinished_jobs(
        vertex: FakeVertex, submit: Submit, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir = tmp_path / "sweep"
    with submit(["experiment=quickstart"], sweep_dir) as names:  # long enough to be running throughout
        detach_and_cancel(vertex, names, sweep_dir, tmp_path, capsys)


def detach_and_cancel(vertex: FakeVertex, names: List[str], sweep_dir: Path, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    vertex.wait_for(lambda: [job.state for job in ours(vertex, names)] == [JobState.JOB_STATE_RUNNING] * 2,
                    timeout=60)
    attached = subprocess.Popen([sys.executable, "-m", "nli.cloud", "attach", str(sweep_dir)], cwd=tmp_path,
                                env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = [read_line(attached.stdout) for _ in range(3)]  # attached, then both jobs' states
        attached.send_signal(signal.SIGINT)
        output, _ = attached.communicate(timeout=60)
    finally:
        attached.kill()
    assert attached.returncode == 130, "".join(seen) + output
    assert "JOB_STATE_RUNNING" in seen[1] + seen[2]
    assert "Detached: the 2 jobs still running go on (nothing was cancelled)" in output and "Traceback" not in output
    assert all(job.state is JobState.JOB_STATE_RUNNING and not job.cancel_requested for job in ours(vertex, names))

    capsys.readouterr()
    assert cloud.main(["cancel", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    cancelled = [line for line in out.splitlines() if line.startswith("cancelled")]
    assert len(cancelled) == 2 and "2 of the sweep's 2 jobs cancelled" in out
    for num, line in enumerate(cancelled):
        assert line.startswith(f"cancelled #{num} ") and line.endswith(f"seed={num + 1} ({names[num]})")
    vertex.wait_for(lambda: all(job.state is JobState.JOB_STATE_CANCELLED for job in ours(vertex, names)), timeout=30)
    assert cloud.main(["cancel", str(sweep_dir)]) == 0
    assert "nothing to cancel: the sweep's 2 jobs have all ended" in capsys.readouterr().out

    assert cloud.main(["attach", str(sweep_dir)]) == 1  # the cancelled jobs' rows, failed
    assert [(row["state"], row["vertex_state"]) for row in read_rows(sweep_dir)] == [
        ("FAILED", "JOB_STATE_CANCELLED")] * 2


@pytest.mark.process
def test_attach_names_the_jobs_a_stopped_launcher_never_submitted(vertex: FakeVertex, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A waiting sweep runs at most max_concurrent_jobs at once: its launcher killed while the first job runs
    never submits the second. attach fills the table with the first and names the second, with its command,
    rather than show one row as the whole sweep."""
    sweep_dir = tmp_path / "sweep"
    before = set(vertex.jobs)
    launcher_process = sweep_cli([*launcher(vertex), *FAST, "seed=1,2", "hydra.launcher.max_concurrent_jobs=1",
                                  "hydra.launcher.sweep_name=stopped", f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    try:  # killed as soon as Vertex AI has the first job: whether or not the launcher had noted it
        vertex.wait_for(lambda: len(set(vertex.jobs) - before) == 1, timeout=120)
        launcher_process.kill()  # the terminal closed: SIGKILL, nothing of the launcher's own runs after it
    finally:
        launcher_process.kill()
        launcher_process.communicate()
    record = json.loads((sweep_dir / "vertex_jobs.json").read_text())
    assert [job["num"] for job in record["jobs"]] in ([], [0])
    assert [(job["num"], job["overrides"][-1]) for job in record["planned"]] == [(0, "seed=1"), (1, "seed=2")]
    capsys.readouterr()

    assert cloud.main(["attach", str(sweep_dir)]) == 1  # not the whole sweep
    out = capsys.readouterr().out
    assert [(row["job"], row["state"], row["seed"]) for row in read_rows(sweep_dir)] == [("0", "COMPLETED", "1")]
    assert "1 of the sweep's jobs were never submitted (#1): its launcher stopped before their turn" in out
    assert re.search(r"^  python train.py -m hydra/launcher=vertex .*seed=2$", out, re.MULTILINE), out
    assert len(set(vertex.jobs) - before) == 1  # attach follows; it submits nothing


# ------------------------------------------------------------------------------ not a sweep


def test_a_folder_that_is_not_a_sweep_is_one_line_with_the_fix(tmp_path: Path, gcs_emulator: Dict[str, str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    give = ("give the folder of a sweep launched with hydra/launcher=vertex: its hydra.sweep.dir, or its folder in "
            "the bucket, <staging_bucket>/<sweep name>")
    (tmp_path / "local").mkdir()
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "sweep_results.jsonl").write_text("")
    for name, record in {"emptied": {}, "cut": {"project": "p", "region": "r", "sweep_name": "s",
                                                "jobs": [{"num": 0, "overrides": []}]}}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "vertex_jobs.json").write_text(json.dumps(record))
    expected = {
        str(tmp_path / "local"): f"{tmp_path / 'local'} is not a Vertex AI sweep's folder: it holds no "
                                 f"vertex_jobs.json, which the launcher writes as it submits each job; {give}",
        str(tmp_path / "slurm"): "(its jobs ran with another launcher, whose results are already in its table)",
        str(tmp_path / "none"): f"{tmp_path / 'none'}: no such folder; {give}",
        str(tmp_path / "emptied"): f"{tmp_path / 'emptied'}/vertex_jobs.json is not the record a sweep writes (no "
                                   "'project'): it was edited or damaged",
        str(tmp_path / "cut"): "vertex_jobs.json is not the record a sweep writes (no 'remote_dir' of a job)",
        "gs://test-bucket/no-sweep": "gs://test-bucket/no-sweep is not a Vertex AI sweep's folder",
        "gs://no-such-bucket/sweep": "SWEEP=gs://no-such-bucket/sweep: bucket no-such-bucket does not exist",
    }
    for command in (["attach"], ["cancel"], ["logs", "--job", "0"]):
        for where, message in expected.items():
            assert cloud.main([command[0], where, *command[1:]]) == 2
            err = capsys.readouterr().err
            assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("missing", ["google.cloud.aiplatform_v1", "hydra_plugins.vertex_launcher._git"])
def test_only_googles_client_missing_is_told_to_install_the_extra(missing: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # as if not installed: importing it raises ImportError
    for imported in ("hydra_plugins.vertex_launcher._core", "hydra_plugins.vertex_launcher._logs"):
        monkeypatch.delitem(sys.modules, imported)  # imported again by the command (and restored after)
    if missing.startswith("google."):
        assert cloud.main(["attach", str(tmp_path)]) == 2
        assert capsys.readouterr().err.startswith("error: python -m nli.cloud needs Google's Vertex AI client")
    else:
        with pytest.raises(ImportError, match=missing):
            cloud.main(["attach", str(tmp_path)])


# ----------------------------------------------------------------------- a sweep of older code

LEGACY = ROOT / "tests" / "data" / "legacy" / "vertex-sweep"  # made by commit 056a8d0 (its README.md)


@pytest.mark.process
def test_attach_follows_a_sweep_that_the_launcher_before_the_packages_submitted(
        gcs_emulator: Dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep folder and the CustomJobs that the launcher of commit 056a8d0 wrote and sent (not waiting):
    today's image runs the jobs as that launcher specified them (its callback's class path included), and
    today's ``attach`` reads its record and fills its table."""
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(LEGACY / "sweep", sweep_dir)
    for blob in (LEGACY / "bucket").rglob("*"):  # what the launcher wrote to the bucket
        if blob.is_file():
            Storage("gs://" + blob.parent.relative_to(LEGACY / "bucket").as_posix()).write_bytes(blob.name,
                                                                                                 blob.read_bytes())
    job_env = {**gcs_emulator, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    (tmp_path / "image").mkdir()  # the image's WORKDIR, where the jobs' run directories (sweep/0) are made
    with FakeVertex(log_dir=tmp_path / "job-logs", job_env=job_env, pending_seconds=0.05) as vertex:
        vertex.add_image(IMAGE, entrypoint=[sys.executable, str(ROOT / "train.py")], workdir=tmp_path / "image")
        record = json.loads((sweep_dir / "vertex_jobs.json").read_text())
        # The only edit: the record names the endpoint of the fake that took the jobs then; Vertex AI's is fixed.
        (sweep_dir / "vertex_jobs.json").write_text(json.dumps({**record, "api_endpoint": vertex.endpoint}))
        for sent in json.loads((LEGACY / "requests.json").read_text()):  # the same requests: the same job names
            vertex.handle("POST", sent["path"], json.dumps(sent["body"]).encode())
        assert sorted(vertex.jobs) == [job["name"] for job in record["jobs"]]

        assert cloud.main(["attach", str(sweep_dir), "--interval", "0.1"]) == 0
    out = capsys.readouterr().out
    rows = sorted(read_rows(sweep_dir), key=lambda row: int(row["job"]))
    assert [(row["job"], row["state"], row["vertex_state"], row["seed"]) for row in rows] == [
        ("0", "COMPLETED", "JOB_STATE_SUCCEEDED", "1"), ("1", "COMPLETED", "JOB_STATE_SUCCEEDED", "2")]
    for num, row in enumerate(rows):
        results = gcs_json(f"{BUCKET}/legacy/{num}/model/results.json")
        assert float(row["objective"]) == results["objective"] and results["train_steps"] == 6
        assert row["sweep"] == record["stamp"]["sweep"] and row["vertex_job"] == record["jobs"][num]["name"]
        assert re.search(f"^#{num} .*seed={num + 1}: JOB_STATE_SUCCEEDED", out, re.MULTILINE)
