"""``python train.py eval.only=true model.name_or_path=<run folder>``: the run's task, data and model settings
come from the folder's config.yaml (nli/config/runfolder.py), what the command types wins, and the evaluation gives
the training run's own final evaluation, for each kind of run folder this project writes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

import pytest
import yaml

from nli.contract import PREEMPTED
from nli.errors import ConfigError
from nli.io.claim import CLAIM_FILE
from nli.io.storage import Storage
from nli.train.checkpoint import Progress
from nli.train.hooks import Revisit
from tests.conftest import build_config
from tests.nli.model.test_pretrained import MINILM
from tests.runs.test_folder import files
from tests.support.nli_layouts import write_sets
from tests.support.runs import FAST, GLUE_DATA, copy_run, read_results, run_app, shared_folder
from tests.sweeps.test_report import SWEEP, run_sweep

ShareRun = Callable[[str, Sequence[str]], Path]
EVAL = ["eval.only=true", "train.progress_bar=false"]
# MiniLM (a pretrained BERT) for a few steps, eager attention and 48 tokens: settings an evaluation must take.
MINILM_FAST = ["task=synthetic", "model=bert-base", f"model.name_or_path={MINILM}", "model.attention=eager",
               "data.max_seq_length=48", "data.synthetic_train_size=64", "data.synthetic_eval_size=40",
               "train.batch_size=16", "train.max_steps=4", "train.eval_every=4", "train.progress_bar=false", "hw=cpu"]


def evaluate(args: List[str], cwd: Path, env: Dict[str, str] | None = None) -> str:
    proc = run_app([*EVAL, *args], cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def metrics(results: Dict[str, Any]) -> Dict[str, Any]:
    """The evaluation's figures: objective and each metric (not the training's own figures)."""
    return {key: value for key, value in results.items() if key in ("objective", "accuracy") or "/" in key}


def evaluated_config(folder: Path) -> Dict[str, Any]:
    return yaml.safe_load((folder / "config.yaml").read_text())


# --------------------------------------------------------------------------- each kind of run folder


@pytest.mark.parametrize("given", ["", "/model"], ids=["run-folder", "its-model"])
def test_the_quickstarts_folder_is_evaluated_from_its_path_alone(shared_run: ShareRun, tmp_path: Path,
                                                                 given: str) -> None:
    trained = shared_run("fast", FAST)
    out = tmp_path / "eval"
    log = evaluate([f"model.name_or_path={trained}{given}", f"hydra.run.dir={out}"], tmp_path)
    assert metrics(read_results(out)) == pytest.approx(metrics(read_results(trained)), abs=1e-9)
    assert (f"model.name_or_path={trained}{given} is a run folder: from {trained}/config.yaml, task=synthetic, "
            "data.synthetic_eval_size=96, data.max_seq_length=64\n") in log
    assert "data: synthetic, no training set; eval validation=96" in log
    config = evaluated_config(out)  # the evaluation's own record: the folder's settings it ran with
    assert (config["task"]["name"], config["data"]["max_seq_length"]) == ("synthetic", 64)


def test_cfg_job_of_an_evaluation_of_a_run_folder_says_what_the_folder_gives(shared_run: ShareRun,
                                                                           tmp_path: Path) -> None:
    """``--cfg job`` showed the config as composed, task mnli and the default lengths, for an evaluation that runs on
    the folder's task and lengths, with no word of them: the config shown passed for the one that runs."""
    trained = shared_run("fast", FAST)
    shown = run_app(["--cfg", "job", *EVAL, f"model.name_or_path={trained}"], cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout)["task"]["name"] == "mnli"  # stdout: the config as composed, to pipe
    assert ("note: the config shown is as composed; an evaluation of a run folder takes more from it as it starts: "
            f"model.name_or_path={trained} is a run folder: from {trained}/config.yaml, task=synthetic, "
            "data.synthetic_eval_size=96, data.max_seq_length=64\n") in shown.stderr
    assert not list(tmp_path.iterdir())


def test_its_default_run_directory_is_named_after_the_folders_task(shared_run: ShareRun, tmp_path: Path) -> None:
    trained = shared_run("fast", FAST)
    evaluate([f"model.name_or_path={trained}"], tmp_path)  # outputs/${task.name}/<time>: the folder's task
    (out,) = (tmp_path / "outputs").iterdir()
    assert out.name == "synthetic" and metrics(read_results(next(out.iterdir()))) == pytest.approx(
        metrics(read_results(trained)), abs=1e-9)


def test_with_the_experiment_typed_its_values_are_the_commands_and_its_scratch_model_gives_way(
        shared_run: ShareRun, tmp_path: Path) -> None:
    trained = shared_run("fast", FAST)
    out = tmp_path / "eval"
    log = evaluate(["experiment=quickstart", f"model.name_or_path={trained}", f"hydra.run.dir={out}"], tmp_path)
    assert metrics(read_results(out)) == pytest.approx(metrics(read_results(trained)), abs=1e-9)
    assert (f"from {trained}/config.yaml, data.synthetic_eval_size=96; model.scratch=null (its exported model is "
            "read as it was trained); the command's own: task=synthetic, data.max_seq_length=64\n") in log


def test_settings_typed_on_the_command_line_win_over_the_folders(shared_run: ShareRun, tmp_path: Path) -> None:
    trained = shared_run("fast", FAST)
    out = tmp_path / "eval"
    log = evaluate([f"model.name_or_path={trained}", "data.max_seq_length=32", "data.max_eval_samples=10",
                    f"hydra.run.dir={out}"], tmp_path)
    assert (f"from {trained}/config.yaml, task=synthetic, data.synthetic_eval_size=96; the command's own: "
            "data.max_eval_samples=10, data.max_seq_length=32\n") in log
    assert "eval validation=10" in log
    config = evaluated_config(out)
    assert (config["data"]["max_seq_length"], config["data"]["max_eval_samples"]) == (32, 10)


def test_a_typed_task_is_the_runs_and_the_models_labels_are_checked_against_it(shared_run: ShareRun,
                                                                              tmp_path: Path) -> None:
    trained = shared_run("fast", FAST)
    out = tmp_path / "rte"
    log = evaluate([f"model.name_or_path={trained}", "task=rte", f"data.dir={GLUE_DATA}", f"hydra.run.dir={out}"],
                   tmp_path)
    assert f"from {trained}/config.yaml, data.max_seq_length=64; the command's own: task=rte, data.dir=" in log
    assert "data: rte, no training set" in log and 0 <= read_results(out)["accuracy"] <= 1
    proc = run_app([*EVAL, f"model.name_or_path={trained}", "task=sst2", f"hydra.run.dir={tmp_path / 'sst2'}"],
                   cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"error: model.name_or_path={trained} predicts the labels ['entailment', 'neutral', 'contradiction'], "
            "and task sst2 has the labels ['negative', 'positive']") in proc.stderr


@pytest.mark.parametrize("key, data", [
    ("data.dir", ["data.dir=glue"]),
    ("data.files.validation", ["+data.files.train=glue/RTE/train.tsv", "+data.files.validation=glue/RTE/dev.tsv"]),
], ids=["data-dir", "data-files"])
def test_a_folders_relative_data_path_not_found_from_here_is_refused_naming_where_it_is(tmp_path: Path, key: str,
                                                                                        data: List[str]) -> None:
    lab = tmp_path / "lab"  # the folder the run was started in, its data beside it, typed as a relative path
    lab.mkdir()
    (lab / "glue").symlink_to(GLUE_DATA)
    trained = lab / "runs" / "rte"
    proc = run_app(["model=tiny", "task=rte", *data, "train.max_steps=1", "train.progress_bar=false", "hw=cpu",
                    "hydra.run.dir=runs/rte"], cwd=lab)
    assert proc.returncode == 0, proc.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = elsewhere / "eval"
    proc = run_app([*EVAL, f"model.name_or_path={trained}", f"hydra.run.dir={out}"], cwd=elsewhere)
    typed, given = data[-1].split("=", 1)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"error: model.name_or_path={trained} is a run folder whose {trained}/config.yaml gives {key}={given}, "
            f"which is not found from {elsewhere}: a relative path, of the folder its run was started in, likely "
            f"{lab}. Nothing was read: give {typed}={lab / given} (a value the command types wins over the folder's), "
            "or run this command from there\n") in proc.stderr
    assert not out.exists()  # said by the command line's check, before Hydra made the folder
    evaluate([f"model.name_or_path={trained}", f"{typed}={lab / given}", f"hydra.run.dir={out}"], elsewhere)
    assert read_results(out)["objective"] == pytest.approx(read_results(trained)["objective"], abs=1e-9)


def test_a_pretrained_models_folder_gives_its_attention_and_length(shared_run: ShareRun, tmp_path: Path) -> None:
    trained = shared_run("minilm-eager", MINILM_FAST)
    out = tmp_path / "eval"
    log = evaluate([f"model.name_or_path={trained}", f"hydra.run.dir={out}"], tmp_path,
                   env={"HF_HUB_OFFLINE": "1"})
    assert metrics(read_results(out)) == pytest.approx(metrics(read_results(trained)), abs=1e-9)
    assert (f"from {trained}/config.yaml, task=synthetic, data.synthetic_eval_size=40, data.max_seq_length=48, "
            "model.attention=eager\n") in log
    assert evaluated_config(out)["model"]["attention"] == "eager"


def test_a_lora_runs_folder_is_evaluated_as_its_merged_export(shared_run: ShareRun, tmp_path: Path) -> None:
    trained = shared_run("lora-fast", [*FAST, "model/peft=lora"])
    out = tmp_path / "eval"
    log = evaluate(["experiment=quickstart", f"model.name_or_path={trained}", f"hydra.run.dir={out}"], tmp_path)
    assert metrics(read_results(out)) == pytest.approx(metrics(read_results(trained)), abs=1e-9)
    assert "model.scratch=null (its exported model is read as it was trained)" in log
    assert evaluated_config(out)["model"]["peft"] is None
    # Adapters asked for on the command line are not the folder's to drop: the config's rule refuses them.
    proc = run_app([*EVAL, "experiment=quickstart", f"model.name_or_path={trained}", "model/peft=lora",
                    f"hydra.run.dir={tmp_path / 'lora'}"], cwd=tmp_path)
    assert proc.returncode == 1 and "model/peft=lora adds new adapters to train" in proc.stderr


def test_a_sweeps_job_folder_is_a_run_folder(shared_root: Path, tmp_path: Path) -> None:
    job = shared_folder(shared_root, "report-sweep", SWEEP, run_sweep) / "1"
    out = tmp_path / "eval"
    log = evaluate([f"model.name_or_path={job}", f"hydra.run.dir={out}"], tmp_path)
    assert metrics(read_results(out)) == pytest.approx(metrics(read_results(job)), abs=1e-9)
    assert f"model.name_or_path={job} is a run folder: from {job}/config.yaml, task=synthetic" in log


def test_a_run_folder_in_a_bucket_is_read_there(shared_run: ShareRun, tmp_path: Path,
                                                gcs_emulator: Dict[str, str]) -> None:
    trained = shared_run("fast", FAST)
    url = "gs://test-bucket/runs/evaluated"
    bucket = Storage(url)
    for name in ("config.yaml", "results.json"):  # a finished run's: one without its results is refused
        bucket.write_bytes(name, (trained / name).read_bytes())
    bucket.upload_dir(trained / "model", "model")
    out = tmp_path / "eval"
    log = evaluate([f"model.name_or_path={url}/model", f"hydra.run.dir={out}"], tmp_path, env=gcs_emulator)
    results = read_results(out)
    assert metrics(results) == pytest.approx(metrics(read_results(trained)), abs=1e-9)
    assert results["evaluated_model"] == f"{url}/model"
    export = json.loads((trained / "model" / "export.json").read_text())
    assert results["evaluated_weights"] == {  # its copy's, checked as a local export is
        "step": export["step"], "sha256": {"model.safetensors": export["files"]["model.safetensors"]["sha256"]}}
    retrained = copy_run(trained, tmp_path / "retrained")  # the run in the bucket trained again: other weights
    reexported(retrained)
    bucket.upload_dir(retrained / "model", "model")
    proc = run_app([*EVAL, f"model.name_or_path={url}/model", f"hydra.run.dir={out}"], cwd=tmp_path, env=gcs_emulator)
    refusal = f"\nerror: {out} holds the evaluation of {url}/model as it was, and its weights have changed since ("
    assert proc.returncode == 1 and refusal in f"\n{proc.stderr}", proc.stderr  # the emulator's own lines aside
    assert f"from {url}/config.yaml, task=synthetic, data.synthetic_eval_size=96, data.max_seq_length=64\n" in log
    unexported = Storage("gs://test-bucket/runs/unexported")
    unexported.write_bytes("config.yaml", (trained / "config.yaml").read_bytes())
    proc = run_app([*EVAL, f"model.name_or_path={unexported.url}", f"hydra.run.dir={tmp_path / 'none'}"],
                   cwd=tmp_path, env=gcs_emulator)
    assert proc.returncode == 1 and "whose run never exported a model" in proc.stderr


# -------------------------------------------------------------------------------- folders that cannot


def test_a_folder_that_cannot_give_its_settings_is_refused_before_hydra_writes(shared_run: ShareRun,
                                                                              tmp_path: Path) -> None:
    trained = shared_run("fast", FAST)
    unexported = tmp_path / "unexported"
    unexported.mkdir()
    shutil.copy(trained / "config.yaml", unexported / "config.yaml")
    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    (broken / "config.yaml").write_text("task: [synthetic\n")
    evaluation = tmp_path / "evaluation"  # an evaluation-only run's folder: config.yaml, no model/
    evaluation.mkdir()
    shutil.copy(trained / "config.yaml", evaluation / "config.yaml")
    (evaluation / "results.json").write_text(json.dumps({"accuracy": 0.5, "evaluated_model": "runs/a/model"}))
    listed = tmp_path / "listed"
    shutil.copytree(trained, listed)
    (listed / "config.yaml").write_text("- task\n")
    lost = copy_run(trained, tmp_path / "lost")  # its export's config.json lost: damaged, not "never exported"
    (lost / "model" / "config.json").unlink()
    said = {unexported: f"error: model.name_or_path={unexported} is a run folder whose run never exported a model "
                        f"({unexported}/model holds no config.json): a run exports its best model at its first "
                        "evaluation. Run its training command again to let it get there",
            broken: f"error: model.name_or_path={broken} is a run folder, and {broken}/config.yaml is not valid YAML "
                    "(line 2: expected ',' or ']', but got '<stream end>'). Restore it from the run",
            evaluation: f"error: model.name_or_path={evaluation} is the folder of an evaluation-only run, which "
                        "exports no model: it evaluated runs/a/model. Point model.name_or_path there",
            listed: f"error: model.name_or_path={listed} is a run folder, and {listed}/config.yaml is not a run's "
                    "config (a mapping of keys; it holds list). Restore it",
            lost: f"error: model.name_or_path={lost}/model is an exported model that is damaged ({lost}/model/"
                  "config.json is missing): export it again (run its training command again with the same output "
                  "folder), or give another model"}
    for folder, error in said.items():
        for given in ([folder, folder / "model"] if folder == lost else [folder]):
            out = tmp_path / f"eval-{folder.name}"
            proc = run_app([*EVAL, f"model.name_or_path={given}", f"hydra.run.dir={out}"], cwd=tmp_path)
            assert proc.returncode == 1 and error in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
            assert not out.exists()  # answered by the command line's check, before Hydra made the folder


@pytest.mark.parametrize("given", ["", "/model"], ids=["run-folder", "its-model"])
def test_an_export_changed_since_it_was_written_is_refused_and_a_whole_one_recorded(shared_run: ShareRun,
                                                                                   tmp_path: Path, given: str) -> None:
    """A tokenizer file lost scored 0.33 for a model of 0.88 (transformers built an empty tokenizer), and flipped
    bytes in the weights were scored without a word: each is checked against model/export.json first."""
    trained = shared_run("fast", FAST)
    lost = copy_run(trained, tmp_path / "lost")
    (lost / "model" / "tokenizer.json").unlink()
    flipped = copy_run(trained, tmp_path / "flipped")
    weights = flipped / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(255 - byte for byte in data[-8:])  # in the last tensor's values
    weights.write_bytes(bytes(data))
    said = {lost: f"{lost}/model/tokenizer.json is missing",
            flipped: f"{weights} is corrupt (its SHA-256 differs from the one export.json records)"}
    for folder, problem in said.items():
        out = tmp_path / f"eval-{folder.name}"
        proc = run_app([*EVAL, f"model.name_or_path={folder}{given}", f"hydra.run.dir={out}"], cwd=tmp_path)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith(f"error: model.name_or_path={folder}/model is an exported model that is "
                                      f"damaged ({problem}): export it again"), proc.stderr
        assert not (out / "results.json").exists()
    out = tmp_path / "eval-whole"
    evaluate([f"model.name_or_path={trained}{given}", f"hydra.run.dir={out}"], tmp_path)
    export = json.loads((trained / "model" / "export.json").read_text())
    assert read_results(out)["evaluated_weights"] == {
        "step": export["step"], "sha256": {"model.safetensors": export["files"]["model.safetensors"]["sha256"]}}


@pytest.mark.parametrize("given", ["", "/model"], ids=["run-folder", "its-model"])
def test_a_runs_export_without_its_record_is_refused_and_a_model_folder_of_no_run_loads(
        shared_run: ShareRun, tmp_path: Path, given: str) -> None:
    """A run's model/ without export.json (written last: an export cut short, a copy that left it out) was scored
    unchecked, where one without a file export.json names was refused. A save_pretrained folder of no run never had
    one: it loads as it did. The advice holds: the run's command exports the model again."""
    trained = shared_run("fast", FAST)
    cut = copy_run(trained, tmp_path / "cut")
    (cut / "model" / "export.json").unlink()
    out = tmp_path / "eval"
    proc = run_app([*EVAL, f"model.name_or_path={cut}{given}", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: model.name_or_path={cut}/model is an exported model that is damaged "
                                  f"({cut}/model/export.json is missing: the record of its files, which the export "
                                  "writes last, so it was cut short or a copy left it out): export it again (run its "
                                  "training command again with the same output folder)"), proc.stderr
    assert not out.exists()
    plain = shutil.copytree(cut / "model", tmp_path / "saved")  # config.json and weights: any save_pretrained folder
    evaluate([f"model.name_or_path={plain}", "task=synthetic", "data.synthetic_eval_size=96",
              "data.max_seq_length=64", f"hydra.run.dir={tmp_path / 'plain'}"], tmp_path)
    assert metrics(read_results(tmp_path / "plain")) == pytest.approx(metrics(read_results(trained)), abs=1e-9)
    again = run_app([*FAST, f"hydra.run.dir={cut}"], cwd=tmp_path)
    assert again.returncode == 0 and "Exporting it again from the best checkpoint" in again.stdout + again.stderr, \
        again.stdout + again.stderr
    evaluate([f"model.name_or_path={cut}{given}", f"hydra.run.dir={out}"], tmp_path)
    assert metrics(read_results(out)) == pytest.approx(metrics(read_results(trained)), abs=1e-9)


def stop_at(run_dir: Path, args: Sequence[str], step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run of ``args`` in ``run_dir``, in this process, stopped by SIGTERM at its step ``step`` as a scheduler
    stops it: sent as the step before ends, it is acted on at the next step boundary, where the run checkpoints and
    exits PREEMPTED."""
    looked = Revisit.on_step_end

    def on_step_end(self: Revisit, progress: Progress, logged: Any) -> None:
        looked(self, progress, logged)
        if progress.step == step - 1:
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patched:
        patched.setattr(Revisit, "on_step_end", on_step_end)
        proc = run_app([*args, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    assert proc.returncode == PREEMPTED and f"SIGTERM at step {step}, checkpoint written" in proc.stderr, proc.stderr


def tree(folder: Path) -> Dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("when", ["before-its-first-evaluation", "after-it", "continued-after-its-end"])
def test_the_folder_of_a_stopped_run_is_refused_naming_its_checkpoint_and_the_command_that_finishes_it(
        shared_run: ShareRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """A run stopped by SIGTERM after its first evaluation (model/: the best so far), or a finished one going on
    with new values stopped after its first new checkpoint (model/: its earlier end's), was scored without a word
    that it never finished; one stopped before its first evaluation was told to run its training command, no
    checkpoint named. Each is refused, the folder untouched, and the command it names finishes the run."""
    trained = shared_run("fast", FAST)
    if when == "continued-after-its-end":
        run_dir, args = copy_run(trained, tmp_path / "run"), [*FAST, "train.max_steps=18",
                                                              "train.accept_changes=[train.max_steps]"]
        stop_at(run_dir, args, 14, monkeypatch)
        expected = (f"is the folder of a run that never finished (it has no results.json, which a run writes last; "
                    f"it stopped at its checkpoint {run_dir}/checkpoints/step-000014): its model/ is the best of "
                    f"step {read_results(trained)['best_step']} before it stopped, not the run's result. Nothing was "
                    "changed. Finish the run with its own command, ")
    else:
        run_dir, args = tmp_path / "run", FAST
        step = 3 if when == "before-its-first-evaluation" else 8  # FAST evaluates at step 6
        stop_at(run_dir, args, step, monkeypatch)
        expected = (f"is a run folder whose run never exported a model ({run_dir}/model holds no config.json): a run "
                    "exports its best model at its first evaluation, and this one stopped before it, at its "
                    f"checkpoint {run_dir}/checkpoints/step-000003. Finish it with its own command, " if step == 3 else
                    "is the folder of a run that never finished (it has no results.json, which a run writes last; it "
                    f"stopped at its checkpoint {run_dir}/checkpoints/step-000008): its model/ is the best of step 6 "
                    "before it stopped, not the run's result. Nothing was changed. Finish the run with its own "
                    "command, ")
    before = tree(run_dir)
    out = tmp_path / "eval"
    proc = run_app([*EVAL, f"model.name_or_path={run_dir}", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: model.name_or_path={run_dir} {expected}"), proc.stderr
    assert tree(run_dir) == before and not out.exists()
    command = re.search(r"own command, (python train\.py .*?)(?:,| then evaluate it;)", proc.stderr)
    assert command is not None, proc.stderr
    typed = shlex.split(command[1])[2:]
    assert typed == [*args, f"hydra.run.dir={run_dir}"]
    finished = run_app(typed, cwd=tmp_path)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    evaluate([f"model.name_or_path={run_dir}", f"hydra.run.dir={out}"], tmp_path)
    assert metrics(read_results(out)) == pytest.approx(metrics(read_results(run_dir)), abs=1e-9)


@pytest.mark.parametrize("given", ["", "/model"], ids=["run-folder", "its-model"])
def test_the_folder_of_a_run_still_training_is_refused(shared_run: ShareRun, tmp_path: Path, given: str) -> None:
    """Its model/ is the best so far, replaced as the run goes on: a score of it would name no weights. Its model/
    given was scored all the same."""
    live = copy_run(shared_run("fast", FAST), tmp_path / "live")
    now = time.time()  # a claim held by a process that runs (pytest's parent), as a training run holds it
    (live / CLAIM_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getppid(), "started": now,
                                               "token": "training", "heartbeat": now}))
    proc = run_app([*EVAL, f"model.name_or_path={live}{given}", f"hydra.run.dir={tmp_path / 'eval'}"], cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith(
        f"error: model.name_or_path={live}{given} is the folder of a run still in progress (host "
        f"{socket.gethostname()}, pid {os.getppid()}"), proc.stderr
    assert "Wait for the run to end, or evaluate a copy of its model/" in proc.stderr
    assert not (tmp_path / "eval").exists()
    (live / CLAIM_FILE).unlink()  # the run ended
    evaluate([f"model.name_or_path={live}{given}", f"hydra.run.dir={tmp_path / 'eval'}"], tmp_path)


@pytest.mark.parametrize("held", ["finished", "stopped"])
def test_an_evaluation_into_a_training_runs_folder_is_told_to_take_its_own(shared_run: ShareRun, tmp_path: Path,
                                                                           held: str) -> None:
    """Given a training run's folder as its own (the run it scores, or another), an evaluation was refused as a run
    of other settings, seven keys listed, and told to run the training command again: it is told, before Hydra
    writes there, to take a folder of its own, and the training run's files are as they were."""
    trained = shared_run("fast", FAST)
    folder = copy_run(trained, tmp_path / "trained")
    what = f"its model, {folder}/model"
    if held == "stopped":  # a run stopped at its checkpoints, before its first export
        shutil.rmtree(folder / "model")
        (folder / "results.json").unlink()
        what = f"its checkpoints, {folder}/checkpoints"
    before = files(folder)
    for where in (f"hydra.run.dir={folder}", f"output_dir={folder}"):
        proc = run_app([*EVAL, f"model.name_or_path={trained}", where], cwd=tmp_path)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and proc.stderr == (
            f"error: {where} is the folder of a training run ({what}): an evaluation-only run there would put its "
            "results.json and config.yaml in place of that run's. Nothing was changed. Give the evaluation its own "
            f"output_dir (or hydra.run.dir); model.name_or_path={folder} scores that run's model from there\n"), \
            proc.stderr
        assert files(folder) == before


def test_a_sweeps_job_folder_that_holds_a_training_run_is_refused_as_the_job_starts(shared_run: ShareRun,
                                                                                   tmp_path: Path) -> None:
    """A sweep's job folder is named by the sweep, not the command: the job refuses it as it takes the folder, with
    the sweep's way out (Hydra reads no hydra.run.dir under -m)."""
    trained = shared_run("fast", FAST)
    sweep_dir = tmp_path / "sweep"
    job = copy_run(trained, sweep_dir / "0")
    before = files(job)
    proc = run_app(["-m", *EVAL, f"model.name_or_path={trained}", f"hydra.sweep.dir={sweep_dir}", "seed=1"],
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"error: {job} is the folder of a training run (its model, {job}/model): an evaluation-only run there "
            "would put its results.json and config.yaml in place of that run's. Nothing was changed. Give the "
            "evaluation its own output_dir (or the sweep another hydra.sweep.dir)") in proc.stdout + proc.stderr
    assert files(job) == before


def reexported(folder: Path) -> None:
    """``folder``'s model/ with other weights, whole (its export.json records them): as a run trained again leaves
    it."""
    model = folder / "model"
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(255 - byte for byte in data[-8:])
    weights.write_bytes(bytes(data))
    record = json.loads((model / "export.json").read_text())
    record["files"]["model.safetensors"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (model / "export.json").write_text(json.dumps(record))


def test_an_evaluation_asked_again_after_its_model_changed_is_refused(shared_run: ShareRun, tmp_path: Path) -> None:
    """Asked again in its folder, an evaluation answers from its results.json: after the model was trained again
    (or replaced) it gave the old model's figures as the new one's."""
    trained = copy_run(shared_run("fast", FAST), tmp_path / "trained")
    out = tmp_path / "eval"
    args = [f"model.name_or_path={trained}", f"hydra.run.dir={out}"]
    evaluate(args, tmp_path)
    first = read_results(out)
    assert "this run already finished" in evaluate(args, tmp_path)  # the same weights: its results
    reexported(trained)
    proc = run_app([*EVAL, *args], cwd=tmp_path)
    old = first["evaluated_weights"]["sha256"]["model.safetensors"]
    new = hashlib.sha256((trained / "model" / "model.safetensors").read_bytes()).hexdigest()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stderr.startswith(
        f"error: {out} holds the evaluation of {trained}/model as it was, and its weights have changed since "
        f"(model.safetensors: SHA-256 {old[:12]} -> SHA-256 {new[:12]}): the model was trained again or replaced, "
        "and those results are not of it. Nothing was changed. Give this evaluation its own output_dir (or "
        "hydra.run.dir), or delete that folder to evaluate there again"), proc.stderr
    assert read_results(out) == first
    evaluate([f"model.name_or_path={trained}", f"hydra.run.dir={tmp_path / 'again'}"], tmp_path)  # the advice taken
    assert read_results(tmp_path / "again")["evaluated_weights"]["sha256"] == {"model.safetensors": new}


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("harm, problem", [
    (lambda m: cut(m / "model.safetensors"), "{m}/model.safetensors has {size} bytes, where its header describes "),
    (lambda m: cut(m / "tokenizer.json"), "{m}/tokenizer.json is not JSON ("),
    (lambda m: (m / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}'),
     "{m}/tokenizer.json is not a tokenizer ("),
], ids=["weights-cut-short", "tokenizer-cut-short", "tokenizer-valid-json"])
def test_a_model_folder_with_a_file_cut_short_is_named_in_one_line(shared_run: ShareRun, tmp_path: Path,
                                                                   harm: Callable[[Path], None], problem: str) -> None:
    """A model folder with no export.json to check it against (a copy of a model/, a checkpoint): transformers' and
    tokenizers' tracebacks ("incomplete metadata, file not fully covered", a JSONDecodeError)."""
    model = Path(shutil.copytree(shared_run("fast", FAST) / "model", tmp_path / "copy"))
    (model / "export.json").unlink()
    harm(model)
    size = (model / "model.safetensors").stat().st_size
    proc = run_app([*EVAL, f"model.name_or_path={model}", "task=synthetic", "data.max_seq_length=64",
                    f"hydra.run.dir={tmp_path / 'eval'}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: model.name_or_path={model} holds a file that cannot be read "
                                  f"({problem.format(m=model, size=size)}"), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Copy the model folder again whole" in proc.stderr
    assert not (tmp_path / "eval" / "results.json").exists()


def test_an_older_versions_keys_are_left_out_and_named(shared_run: ShareRun, tmp_path: Path) -> None:
    trained = shared_run("fast", FAST)
    older = tmp_path / "older"
    shutil.copytree(trained, older)
    config = evaluated_config(older)
    config["task"]["retired"] = True
    config["task"]["tokenizer_hint"] = "bpe"
    del config["task"]["hub_revision"]  # added since: its default
    (older / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "eval"
    log = evaluate([f"model.name_or_path={older}", f"hydra.run.dir={out}"], tmp_path)
    assert metrics(read_results(out)) == pytest.approx(metrics(read_results(trained)), abs=1e-9)
    assert re.search(r"; left out, unknown to this version: task\.retired, task\.tokenizer_hint\n", log), log
    assert json.loads(json.dumps(evaluated_config(out)["task"]))["hub_revision"] is None


def test_an_evaluation_folder_asked_for_more_sets_is_told_to_evaluate_in_a_folder_of_its_own(
        shared_run: ShareRun, tmp_path: Path) -> None:
    """An evaluation-only run's folder has no checkpoint to continue: the advice was train.accept_changes, which was
    then refused ("no checkpoint to continue it from")."""
    trained = shared_run("fast", FAST)
    out = tmp_path / "eval"
    evaluate([f"model.name_or_path={trained}", f"hydra.run.dir={out}"], tmp_path)
    more = [*EVAL, f"model.name_or_path={trained}", "eval.extra=[hans]", f"eval.dir={write_sets(tmp_path / 'sets')}"]
    refused = run_app([*more, f"hydra.run.dir={out}"], cwd=tmp_path)
    assert refused.returncode == 1
    assert f"{out} holds a finished run with other settings:\n  eval.dir: " in refused.stderr
    assert "train.accept_changes" not in refused.stderr
    assert ("or give this run its own output_dir (or hydra.run.dir), or delete that folder; an evaluation's folder "
            "has no checkpoint to go on from with new values") in refused.stderr
    evaluate([*more[len(EVAL):], f"hydra.run.dir={tmp_path / 'more'}"], tmp_path)  # the advice taken
    assert "hans/accuracy" in read_results(tmp_path / "more")


def test_a_model_path_beside_a_scratch_architecture_is_told_the_fix() -> None:
    """Not a run folder (a checkpoint, a Hub id): the quickstart's model.scratch and a path, and what to set."""
    with pytest.raises(ConfigError, match=re.escape("; both are set: model.scratch=null reads my/model, "
                                                    "model.name_or_path=null builds model.scratch")):
        build_config(["experiment=quickstart", "eval.only=true", "model.name_or_path=my/model"])


def test_a_run_folder_to_train_on_from_is_told_its_model(shared_run: ShareRun, tmp_path: Path) -> None:
    """An evaluation reads a run folder as its model/; a run that trains on from it was told only that the folder has
    no config.json."""
    trained = shared_run("minilm-eager", MINILM_FAST)
    proc = run_app([*MINILM_FAST, f"model.name_or_path={trained}", f"hydra.run.dir={tmp_path / 'on'}"], cwd=tmp_path,
                   env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert (f"error: model.name_or_path={trained} is a run folder: the model it trained is {trained / 'model'}. "
            f"Set model.name_or_path={trained / 'model'} to train on from it") in proc.stderr, proc.stderr
    proc = run_app([*MINILM_FAST, f"model.name_or_path={trained / 'model'}", f"hydra.run.dir={tmp_path / 'on'}"],
                   cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the advice taken


def test_a_folder_inside_a_model_or_a_checkpoint_is_refused_before_hydra_writes(shared_run: ShareRun,
                                                                               tmp_path: Path) -> None:
    """A run (an evaluation, or a training run) or a sweep given a folder inside a model folder or a checkpoint wrote
    its files among the model's (an export then replaced the folder whole, the run's files with it) or a checkpoint's
    (removed as the run's checkpoints rotate). Each is refused in one line, before Hydra writes there."""
    trained = copy_run(shared_run("fast", FAST), tmp_path / "trained")
    before = files(trained)
    step = trained / "checkpoints" / "step-000012"
    said = {trained / "model" / "eval": f"is inside the model folder {trained}/model",
            step: f"is the checkpoint {step}", step / "eval": f"is inside the checkpoint {step}",
            trained / "checkpoints": f"is the checkpoints folder {trained}/checkpoints"}
    for folder, where in said.items():
        for args, key, what in (([*EVAL, f"model.name_or_path={trained}"], "hydra.run.dir", "run"),
                                (FAST, "hydra.run.dir", "run"), (["-m", *FAST, "seed=1"], "hydra.sweep.dir", "sweep")):
            proc = run_app([*args, f"{key}={folder}"], cwd=tmp_path)
            assert proc.returncode == 1 and proc.stderr == (
                f"error: {key}={folder} {where}: the {what}'s files would be mixed into it, and taken for its own or "
                f"removed with it. Give the {what} a folder of its own\n"), proc.stdout + proc.stderr
    proc = run_app(["-m", *EVAL, f"model.name_or_path={trained}", f"hydra.sweep.dir={tmp_path / 'sweep'}", "seed=1",
                    f"output_dir={trained / 'model' / 'eval'}"], cwd=tmp_path)  # a job's folder, refused as it starts
    assert proc.returncode == 1 and (f"error: {trained}/model/eval is inside the model folder {trained}/model: the "
                                     "run's files would be mixed into it") in proc.stdout + proc.stderr
    assert "Give the run its own output_dir (or the sweep another hydra.sweep.dir)" in proc.stdout + proc.stderr
    assert files(trained) == before and not (trained / "model" / "eval").exists()
