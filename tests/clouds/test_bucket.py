"""Models and sweeps in a bucket, on the Cloud Storage emulator: a model given by its ``gs://`` URL is
copied once per version into the local cache and read there (nli/model/bucket.py), through train.py as a
user runs it; and ``python -m nli.report gs://...`` reports a Vertex AI sweep's folder (nli/sweep/report.py)."""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Sequence
from urllib.parse import quote

import pytest
import yaml

from nli.errors import ConfigError, StorageError
from nli.io.storage import Storage
from nli.model import bucket as bucketcopy
from nli.sweep import report
from tests.runs.test_distributed import torchrun
from tests.runs.test_eval_folder import metrics
from tests.support.runs import FAST, read_results, run_app, shared_folder
from tests.sweeps.test_report import SWEEP, run_sweep, tables

ShareRun = Callable[[str, Sequence[str]], Path]


@pytest.fixture
def run_in_bucket(shared_run: ShareRun, gcs_emulator: Dict[str, str], tmp_path: Path) -> str:
    """The fast quickstart's run folder, as a job of a Vertex AI sweep leaves it in the bucket (its
    config, results and exported model; a folder of this test's own, so that no other test's copy counts)."""
    trained = shared_run("fast", FAST)
    url = f"gs://test-bucket/{tmp_path.name}/run"
    bucket = Storage(url)
    for name in ("config.yaml", "overrides.yaml", "results.json"):
        bucket.write_bytes(name, (trained / name).read_bytes())
    bucket.upload_dir(trained / "model", "model")
    return url


@contextmanager
def served(emulator_log: logging.Logger) -> Iterator[List[str]]:
    """The request lines the emulator (in this process's threads) logs meanwhile ("GET /download/... HTTP/1.1")."""
    lines: List[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage().strip('"'))  # type: ignore[method-assign]
    level = emulator_log.level
    emulator_log.setLevel(logging.INFO)  # setLevel: its children's cached levels are cleared with it
    emulator_log.addHandler(handler)
    try:
        yield lines
    finally:
        emulator_log.removeHandler(handler)
        emulator_log.setLevel(level)


def copies(url: str) -> List[Path]:
    """The versions of ``url`` in the cache."""
    folder = bucketcopy.cache_dir() / bucketcopy._digest([url])[:16]
    return sorted(path for path in folder.iterdir() if not path.name.startswith(".")) if folder.is_dir() else []


# ------------------------------------------------------------------------------- models in a bucket


def test_a_model_in_a_bucket_is_fine_tuned_from_its_copy_made_once(run_in_bucket: str, tmp_path: Path,
                                                                    gcs_emulator: Dict[str, str]) -> None:
    model = f"{run_in_bucket}/model"  # the recipes' chaining step: RTE from an MNLI run's export
    args = [*FAST, f"model.name_or_path={model}", "model.scratch=null"]
    first = run_app([*args, f"hydra.run.dir={tmp_path / 'first'}"], cwd=tmp_path, env=gcs_emulator)
    assert first.returncode == 0, first.stdout + first.stderr
    copied = copies(model)[0] / "model"
    assert f"model.name_or_path={model}: copied to {copied} ({len(list(copied.iterdir()))} files" in first.stdout
    assert read_results(tmp_path / "first")["status"] == "completed"
    again = run_app([*args, f"hydra.run.dir={tmp_path / 'again'}"], cwd=tmp_path, env=gcs_emulator)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"model.name_or_path={model}: read from its copy in {copies(model)[0]}/model (the folder is unchanged" \
        in again.stdout
    assert "copied to" not in again.stdout and len(copies(model)) == 1
    assert read_results(tmp_path / "again")["objective"] == read_results(tmp_path / "first")["objective"]


@pytest.mark.process
def test_a_model_in_a_bucket_is_copied_by_a_machines_first_process_for_all_of_them(
        run_in_bucket: str, tmp_path: Path, gcs_emulator: Dict[str, str]) -> None:
    """Two processes (torchrun) fine-tune one model in a bucket as one run, from one copy in the cache (the path
    recipe.local_model takes with several processes), downloaded once: the emulator serves the weights once."""
    model = f"{run_in_bucket}/model"
    run_dir = tmp_path / "run"
    with served(logging.getLogger("gcp_storage_emulator")) as requests:
        proc = torchrun([*FAST, f"model.name_or_path={model}", "model.scratch=null", "hw=cpu",
                         "train.progress_bar=false", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "x 2 processes" in log and log.count(f"model.name_or_path={model}: copied to") == 1
    assert len(copies(model)) == 1 and read_results(run_dir)["status"] == "completed"
    weights = quote(f"{tmp_path.name}/run/model/model.safetensors", safe="")
    assert len([line for line in requests if line.startswith("GET ") and weights in line and "alt=media" in line]) == 1


def test_eval_only_of_a_run_folder_in_a_bucket_gives_the_local_folders_metrics(
        run_in_bucket: str, shared_run: ShareRun, tmp_path: Path, gcs_emulator: Dict[str, str]) -> None:
    trained = shared_run("fast", FAST)
    outputs = []
    for name in ("first", "again"):
        proc = run_app(["eval.only=true", f"model.name_or_path={run_in_bucket}", f"hydra.run.dir={tmp_path / name}"],
                       cwd=tmp_path, env=gcs_emulator)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert metrics(read_results(tmp_path / name)) == pytest.approx(metrics(read_results(trained)), abs=1e-9)
        assert read_results(tmp_path / name)["evaluated_model"] == f"{run_in_bucket}/model"
        outputs.append(proc.stdout)
    assert "copied to" in outputs[0] and "copied to" not in outputs[1] and "read from its copy in" in outputs[1]


def test_a_rewritten_model_is_copied_again_and_a_damaged_one_refused(run_in_bucket: str,
                                                                     gcs_emulator: Dict[str, str]) -> None:
    model = f"{run_in_bucket}/model"
    first = bucketcopy.local_copy(model)
    assert bucketcopy.local_copy(model) == first
    bucket = Storage(model)
    bucket.write_bytes("tokenizer_config.json", bucket.read_bytes("tokenizer_config.json"))  # a new generation
    again = bucketcopy.local_copy(model)
    assert again != first and again.is_dir() and len(copies(model)) == 2
    assert {path.name for path in again.iterdir()} == {path.name for path in first.iterdir()}
    bucket.write_bytes("config.json", bucket.read_bytes("config.json") + b" ")  # not the file export.json records
    with pytest.raises(ConfigError, match=f"{model} is damaged \\({model}/config.json has .* bytes, where .* were "
                                          "exported\\): export it again"):
        bucketcopy.local_copy(model)
    assert len(copies(model)) == 2  # the damaged copy was not kept


TRAIN, EVAL = [*FAST, "model.scratch=null"], ["eval.only=true"]


@pytest.mark.parametrize("args, given, message", [
    (TRAIN, "gs://no-such-bucket/run/model", "model.name_or_path=gs://no-such-bucket/run/model: bucket no-such-bucket "
                                             "does not exist: check the URL"),
    (TRAIN, "gs://test-bucket/no/such/run/model", "model.name_or_path=gs://test-bucket/no/such/run/model holds no "
                                                  "files: check the path (gcloud storage ls gs://test-bucket/no/such/"
                                                  "run/)"),
    (EVAL, "gs://no-such-bucket/run", "model.name_or_path=gs://no-such-bucket/run: bucket no-such-bucket does not "
                                      "exist: check the URL"),
], ids=["train-bucket", "train-path", "eval-bucket"])
def test_a_missing_bucket_or_path_is_one_line_with_the_fix(args: List[str], given: str, message: str, tmp_path: Path,
                                                           gcs_emulator: Dict[str, str]) -> None:
    proc = run_app([*args, f"model.name_or_path={given}", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                   env=gcs_emulator)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith(f"error: {message}")
    assert "\n" not in proc.stderr.strip() and "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists()  # answered before the run took its folder


def test_a_run_folder_or_an_unreachable_bucket_is_told_the_fix(run_in_bucket: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=f"it is a run folder: give its model, model.name_or_path={run_in_bucket}/"
                                          "model$"):
        bucketcopy.local_copy(run_in_bucket)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(StorageError, match="cannot reach Cloud Storage .*; check the network"):
        bucketcopy.local_copy(f"{run_in_bucket}/model")


# ------------------------------------------------------------------------------- sweeps in a bucket


def test_a_vertex_sweeps_folder_in_a_bucket_is_reported_as_the_sweep(shared_root: Path, tmp_path: Path,
                                                                     gcs_emulator: Dict[str, str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    shared_sweep = shared_folder(shared_root, "report-sweep", SWEEP, run_sweep)
    url = f"gs://test-bucket/{tmp_path.name}/sweep"
    bucket = Storage(url)
    for job in range(4):  # as Vertex AI jobs leave them: <sweep>/<job number>/model is the run's folder
        bucket.upload_dir(shared_sweep / str(job), f"{job}/model")
        bucket.write_text(f"{job}/model/job_return.json", json.dumps(
            {"status": "COMPLETED", "return_value": read_results(shared_sweep / str(job))["objective"]}))
    # A job that failed before its run wrote anything: its overrides are those the launcher recorded.
    bucket.write_text("4/model/job_return.json", json.dumps({"status": "FAILED", "error": "DataError: no data"}))
    overrides = [each.replace("seed=1", "seed=3") for each in yaml.safe_load((shared_sweep / "0" / "overrides.yaml")
                                                                              .read_text())]
    bucket.write_text("vertex_jobs.json", json.dumps({"jobs": [{"num": 4, "overrides": overrides}]}))
    monkeypatch.chdir(tmp_path)
    assert report.main([url]) == 0
    assert report.main([str(shared_sweep), "--out", str(tmp_path / "local")]) == 0
    remote = tables((tmp_path / "reports" / "sweep" / "report.md").read_text())["Jobs"]
    local = tables((tmp_path / "local" / "report.md").read_text())["Jobs"]
    shown = ("job", "state", "optimizer.lr", "seed", "objective", "accuracy")
    assert [{key: row[key] for key in shown} for row in remote[:4]] == [{key: row[key] for key in shown}
                                                                         for row in local]
    assert [remote[4][key] for key in ("job", "state", "seed", "error")] == ["4", "FAILED", "3", "DataError: no data"]
    assert (tmp_path / "reports" / "sweep" / report.LEARNING_CURVES).is_file()  # the jobs' metrics.csv, read there


def test_a_bucket_folder_that_is_no_sweep_is_one_line(gcs_emulator: Dict[str, str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main(["gs://test-bucket/no-such-sweep"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: gs://test-bucket/no-such-sweep: nothing there; expected the folder of a Vertex AI sweep, "
                   "<staging_bucket>/<sweep name> (gcloud storage ls lists it)\n")
    assert report.main(["gs://no-such-bucket/sweep"]) == 2
    assert capsys.readouterr().err == ("error: DIR=gs://no-such-bucket/sweep: bucket no-such-bucket does not exist: "
                                       "check the URL (gcloud storage ls lists your buckets)\n")
