"""What a folder says is what happened: ``model/export.json`` records the size and SHA-256 of every file
of the export, and a finished run started again checks its ``model/`` against it. A model that is
missing or damaged is exported again from the best checkpoint (the same weights, bit for bit), with a
warning naming what was wrong; where that checkpoint is gone too, the run says so and changes nothing.
The real train.py, in this process; locally, in a bucket (the Cloud Storage emulator), and under LoRA."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Dict, Sequence

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file

from nli.train.checkpoint import STATE, checkpoint_name
from tests.runs.test_folder import files
from tests.support.glue_layouts import stsb_with_one_gold_score
from tests.support.runs import FAST, GLUE_DATA, copy_run, read_results, run_app

LORA = ["model/peft=lora"]


def again(run_dir: Path, args: Sequence[str] = FAST, env: Dict[str, str] | None = None) -> str:
    """The run of ``args`` started again in ``run_dir``, which it already finished."""
    proc = run_app([*args, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    output = proc.stdout + proc.stderr
    assert "this run already finished" in output and "training:" not in output
    return output


def model_files(run_dir: Path) -> Dict[str, bytes]:
    """The weights of the export (under LoRA, the merged model's and the adapter's)."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted((run_dir / "model").rglob("*.safetensors"))}


@pytest.fixture
def finished(shared_run: Callable[[str, Sequence[str]], Path]) -> Path:
    return shared_run("fast", FAST)


def test_export_json_records_the_size_and_sha256_of_every_file_of_the_export(finished: Path) -> None:
    record = json.loads((finished / "model" / "export.json").read_text())
    on_disk = sorted(str(p.relative_to(finished / "model")) for p in (finished / "model").rglob("*") if p.is_file())
    assert sorted(record["files"]) == [name for name in on_disk if name != "export.json"]
    assert "model.safetensors" in record["files"] and "tokenizer.json" in record["files"]
    for name, expected in record["files"].items():
        data = (finished / "model" / name).read_bytes()
        assert expected == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert record["step"] == read_results(finished)["best_step"] and record["objective"] is not None


def test_a_finished_run_whose_model_was_deleted_exports_it_again_from_the_best_checkpoint(finished: Path,
                                                                                          tmp_path: Path) -> None:
    run_dir = copy_run(finished, tmp_path / "run")
    shutil.rmtree(run_dir / "model")
    output = again(run_dir)
    assert (f"this run finished, but its model is missing or damaged: {run_dir / 'model'} is missing. Exporting it "
            f"again from the best checkpoint, {run_dir / 'checkpoints' / 'step-000006'}") in output
    assert model_files(run_dir) == model_files(finished)  # the best checkpoint's weights, bit for bit
    record, before = (json.loads((d / "model" / "export.json").read_text()) for d in (run_dir, finished))
    assert {k: record[k] for k in ("step", "metrics", "objective")} == \
        {k: before[k] for k in ("step", "metrics", "objective")}
    assert read_results(run_dir) == read_results(finished)
    assert "is missing or damaged" not in again(run_dir)  # whole again: checked, and left as it is


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("harm, said", [
    (lambda model: corrupt(model / "model.safetensors"),
     "{model}/model.safetensors is corrupt (its SHA-256 differs from the one export.json records)"),
    (lambda model: (model / "model.safetensors").write_bytes(b"cut short"),
     "{model}/model.safetensors has 9 bytes, where"),
    (lambda model: (model / "tokenizer.json").unlink(), "{model}/tokenizer.json is missing"),
    (lambda model: (model / "export.json").write_text("{not json"), "{model}/export.json cannot be read"),
    (lambda model: (model / "export.json").unlink(), "{model}/export.json is missing"),
], ids=["corrupt", "truncated", "file-missing", "record-unreadable", "record-missing"])
def test_a_damaged_model_is_named_and_exported_again(finished: Path, tmp_path: Path,
                                                     harm: Callable[[Path], None], said: str) -> None:
    run_dir = copy_run(finished, tmp_path / "run")
    harm(run_dir / "model")
    output = again(run_dir)
    assert "this run finished, but its model is missing or damaged: " + said.format(model=run_dir / "model") in output
    assert model_files(run_dir) == model_files(finished)
    assert (run_dir / "model" / "tokenizer.json").is_file()
    assert json.loads((run_dir / "model" / "export.json").read_text())["files"]


def test_with_the_best_checkpoint_gone_too_the_run_says_so_and_changes_nothing(finished: Path,
                                                                               tmp_path: Path) -> None:
    run_dir = copy_run(finished, tmp_path / "run")
    (run_dir / "model" / "model.safetensors").unlink()
    shutil.rmtree(run_dir / "checkpoints" / "step-000006")
    before = files(run_dir)
    proc = run_app([*FAST, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"error: this run finished, but its model is missing or damaged ({run_dir}/model/model.safetensors is "
            f"missing), and the best checkpoint it was exported from, {run_dir}/checkpoints/step-000006, is gone: the "
            "model cannot be made again. Nothing was changed. Train again in another output_dir, or delete "
            f"{run_dir} and train there afresh") in proc.stderr
    assert files(run_dir) == before


def test_an_export_from_before_the_digests_is_taken_as_it_is(finished: Path, tmp_path: Path) -> None:
    """An export.json that records no files (written before it did) has nothing to check the model
    against: the run is finished, as it was."""
    run_dir = copy_run(finished, tmp_path / "run")
    record = json.loads((run_dir / "model" / "export.json").read_text())
    del record["files"]
    (run_dir / "model" / "export.json").write_text(json.dumps(record, indent=1) + "\n")
    before = model_files(run_dir)
    output = again(run_dir)
    assert "missing or damaged" not in output and model_files(run_dir) == before
    assert "files" not in json.loads((run_dir / "model" / "export.json").read_text())


def test_under_lora_the_merged_model_and_its_adapter_are_exported_again(
        shared_run: Callable[[str, Sequence[str]], Path], tmp_path: Path) -> None:
    lora_run = shared_run("lora-fast", [*FAST, *LORA])
    run_dir = copy_run(lora_run, tmp_path / "run")
    (run_dir / "model" / "adapter" / "adapter_model.safetensors").unlink()
    corrupt(run_dir / "model" / "model.safetensors")
    output = again(run_dir, [*FAST, *LORA])
    assert (f"damaged: {run_dir}/model/adapter/adapter_model.safetensors is missing; {run_dir}/model/model.safetensors "
            "is corrupt") in output
    assert model_files(run_dir) == model_files(lora_run) and len(model_files(run_dir)) == 2


def test_in_a_bucket_a_lost_model_is_exported_again(tmp_path: Path, gcs_emulator: Dict[str, str]) -> None:
    import gcsfs

    url, root = "gs://test-bucket/runs/export-again", "test-bucket/runs/export-again"
    args = [*FAST, f"output_dir={url}"]
    proc = run_app([*args, f"hydra.run.dir={tmp_path}/hydra"], cwd=tmp_path, env=gcs_emulator)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fs = gcsfs.GCSFileSystem()
    exported = fs.cat_file(f"{root}/model/model.safetensors")
    fs.rm(f"{root}/model/model.safetensors")
    fs.pipe_file(f"{root}/model/tokenizer.json", b"{}")
    fs.invalidate_cache()
    output = again(tmp_path / "hydra-again", args, env=gcs_emulator)
    assert (f"damaged: {url}/model/model.safetensors is missing; {url}/model/tokenizer.json has 2 bytes, where"
            in output)
    fs.invalidate_cache()
    assert fs.cat_file(f"{root}/model/model.safetensors") == exported
    assert json.loads(fs.cat_file(f"{root}/model/tokenizer.json"))  # the tokenizer, whole again


# ------------------------------------------------------------------------------- the model card


def card_metrics(card: ModelCard) -> Dict[str, float]:
    """The model-index's metrics as huggingface_hub's own parser reads them back, by name."""
    return {result.metric_name: result.metric_value for result in card.data.eval_results or []}


def test_the_model_card_gives_the_hub_the_best_checkpoints_metrics_and_the_command(finished: Path) -> None:
    card = ModelCard.load(finished / "model" / "README.md")
    record, results = json.loads((finished / "model" / "export.json").read_text()), read_results(finished)
    assert record["metrics"] == {key: results[key] for key in ("accuracy", "loss", "ece", "brier")}
    assert card_metrics(card) == {"accuracy": results["accuracy"]}  # the task's metrics: the Hub has no eval loss
    assert card.data.model_name == "scratch-synthetic" and card.data.base_model is None  # model=tiny: no base
    assert card.data.datasets is None  # task=synthetic is generated: no data set on the Hub
    (result,) = card.data.eval_results
    assert (result.task_type, result.dataset_type, result.dataset_split) == ("text-classification", "synthetic",
                                                                            "validation")
    provenance = results["provenance"]
    assert f"git checkout {provenance['commit']}\n{provenance['command']}\n" in card.text
    assert "| optimizer.lr | 0.001 |" in card.text  # experiment=quickstart's rate
    assert f"| torch | {provenance['versions']['torch']} |" in card.text
    assert "README.md" in record["files"]  # export.json vouches for the card too


def test_a_glue_tasks_card_names_glue_on_the_hub_with_the_tasks_config(tmp_path: Path) -> None:
    """GLUE's Hub id and the task's config; the split as scored: 32 examples of RTE's 277 are not its validation
    split, which the Hub's model-index named."""
    out = tmp_path / "run"
    proc = run_app(["task=rte", f"data.dir={GLUE_DATA}", "model=tiny", "data.max_seq_length=64", "train.batch_size=16",
                    "data.max_train_samples=64", "data.max_eval_samples=32", "train.max_steps=2",
                    "train.progress_bar=false", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    card = ModelCard.load(out / "model" / "README.md")
    assert card.data.datasets == ["nyu-mll/glue"] and card.data.model_name == "scratch-rte"
    (result,) = card.data.eval_results
    assert (result.dataset_type, result.dataset_config, result.dataset_split, result.dataset_name) == (
        "nyu-mll/glue", "rte", "validation (at most its first 32 examples: data.max_eval_samples)", "GLUE RTE")
    assert card_metrics(card) == {"accuracy": read_results(out)["accuracy"]}


def test_an_edited_model_card_is_damage_and_the_runs_card_is_written_again(finished: Path, tmp_path: Path) -> None:
    run_dir = copy_run(finished, tmp_path / "run")
    card = run_dir / "model" / "README.md"
    card.write_text(card.read_text().replace("value: ", "value: 1"))  # metrics the run never scored
    output = again(run_dir)
    assert f"its model is missing or damaged: {card} has " in output
    assert card.read_bytes() == (finished / "model" / "README.md").read_bytes()
    assert model_files(run_dir) == model_files(finished)


def test_a_full_disk_during_the_export_is_said_in_one_line_and_the_same_command_continues(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills while the best model's weights are written into the run folder: safetensors' writer (in
    Rust) leaves part of the file and raises its own error, "No space left on device (os error 28)", as it does
    on a full disk; the checkpoint before it is whole. Shown before as that error's traceback."""
    import transformers.modeling_utils
    from safetensors import SafetensorError

    run_dir = tmp_path / "run"

    def full(tensors: object, filename: str, metadata: object = None) -> None:
        Path(filename).write_bytes(b"\0" * 4096)  # what fitted
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with monkeypatch.context() as disk:
        disk.setattr(transformers.modeling_utils, "safe_save_file", full)  # what save_pretrained writes with
        failed = run_app([*FAST, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert failed.returncode == 1
    message = failed.stderr.strip()
    assert "\n" not in message and len(message) < 300, message
    assert message.startswith(f"error: could not write {run_dir / 'model'}: no space left on its disk: make room "
                              "there and run the same command again")
    assert (run_dir / "checkpoints" / "step-000006" / "checkpoint.json").exists()  # written before the export
    assert not (run_dir / "model").exists() and not list(run_dir.glob(".model*"))  # no half model, no staging
    done = run_app([*FAST, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "resuming from checkpoint" in done.stdout + done.stderr
    assert read_results(run_dir)["train_steps"] == 12


RTE_TINY = ["task=rte", f"data.dir={GLUE_DATA}", "model=tiny", "data.max_seq_length=64", "train.batch_size=16",
            "train.max_steps=4", "train.eval_every=2", "train.progress_bar=false", "hw=cpu"]


@pytest.mark.parametrize("predict", [False, True], ids=["nothing-evaluated-again", "test-predictions"])
def test_the_end_of_a_run_reads_and_writes_the_model_again_only_where_something_evaluates_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, predict: bool) -> None:
    """The best evaluation is exported when it is made. Where nothing evaluates the model after training
    (no eval.extra, no test predictions), the end neither reads the best checkpoint back nor exports and
    loads the model a second time; with test predictions the export is read back, and they come from it.
    Either way model/ holds the best checkpoint's weights, and export.json its evaluation."""
    from nli import recipe
    from nli.output import export

    calls: Dict[str, int] = {}

    def counted(name: str, function: Callable) -> Callable:
        def wrapped(*args: object, **kwargs: object) -> object:
            calls[name] = calls.get(name, 0) + 1
            return function(*args, **kwargs)
        return wrapped

    for module, name in ((recipe, "load_export"), (export, "save_weights"), (export, "best_weights")):
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    run_dir = tmp_path / "run"
    proc = run_app([*RTE_TINY, f"train.predict={str(predict).lower()}", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    improvements = proc.stdout.count("the best so far, exported to")
    assert improvements >= 1
    assert calls == ({"save_weights": improvements + 1, "best_weights": 1, "load_export": 1} if predict else
                     {"save_weights": improvements})
    assert (run_dir / "predictions" / "RTE.tsv").is_file() == predict
    results, record = read_results(run_dir), json.loads((run_dir / "model" / "export.json").read_text())
    assert record["step"] == results["best_step"] and record["objective"] == results["objective"]
    state = torch.load(run_dir / "checkpoints" / checkpoint_name(results["best_step"]) / STATE, weights_only=True)
    exported = load_file(run_dir / "model" / "model.safetensors")
    assert exported and all(torch.equal(tensor, state["parts"]["model"][name]) for name, tensor in exported.items())


def test_the_same_command_removes_the_half_export_of_a_killed_run(finished: Path, tmp_path: Path) -> None:
    """An export is written into a staging folder beside model/ (Storage.staged_dir): a run SIGKILLed mid-export
    leaves it, gigabytes for a large model. The next run in the folder, once it holds it, removes it
    (the staging names: tests/nli/io/test_storage.py)."""
    run_dir = copy_run(finished, tmp_path / "run")
    left = Path(tempfile.mkdtemp(dir=run_dir, prefix=".model.4242.", suffix=".tmp"))
    (left / "model.safetensors").write_bytes(b"half of the weights")
    output = again(run_dir)
    assert f"removed what a run stopped mid-write left in {run_dir}: {left.name}" in output
    assert not left.exists() and model_files(run_dir) == model_files(finished)


def test_a_card_of_a_model_trained_on_your_own_files_names_them_and_not_glue(tmp_path: Path) -> None:
    """task=rte on files of your own: the card said "fine-tuned on GLUE RTE", and its model-index gave figures
    measured on the user's dev file as GLUE RTE's (config rte). It names the files, and GLUE nowhere."""
    import pandas as pd

    files = {}
    for split, name in [("train", "train"), ("validation", "dev")]:
        files[split] = tmp_path / f"{name}.csv"
        pd.read_csv(GLUE_DATA / "RTE" / f"{name}.tsv", sep="\t", quoting=3).to_csv(files[split], index=False)
    out = tmp_path / "run"
    proc = run_app(["task=rte", *(f"+data.files.{split}={path}" for split, path in files.items()), "model=tiny",
                    "data.max_seq_length=64", "train.batch_size=16", "data.max_train_samples=64", "train.max_steps=2",
                    "train.progress_bar=false", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    card = ModelCard.load(out / "model" / "README.md")
    assert "GLUE" not in card.content and not card.data.datasets
    title = "your own data for task rte (train: train.csv, validation: dev.csv)"
    assert f"fine-tuned on {title}, the checkpoint of step" in card.text
    (result,) = card.data.eval_results
    assert (result.dataset_type, result.dataset_config, result.dataset_split, result.dataset_name) == (
        "csv", None, "validation", title)
    assert card_metrics(card) == {"accuracy": read_results(out)["accuracy"]}


@pytest.mark.process
def test_under_torchrun_a_model_that_cannot_be_made_again_stops_every_process_in_one_line(finished: Path,
                                                                                          tmp_path: Path) -> None:
    """Rank 0 alone checks a finished run's model/: where it could not be made again (its checkpoint gone too), rank 0
    stopped with the reason, and rank 1, waiting for it at a barrier, failed in gloo's traceback ("Connection closed
    by peer"); under NCCL, where no launcher ends it, it waited for hw.collective_timeout_minutes. Now every process
    stops with rank 0's reason."""
    from tests.runs.test_distributed import torchrun

    run_dir = copy_run(finished, tmp_path / "run")
    (run_dir / "model" / "model.safetensors").unlink()
    shutil.rmtree(run_dir / "checkpoints" / "step-000006")
    before = files(run_dir)
    proc = torchrun([*FAST, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode != 0 and "Connection closed" not in proc.stderr, proc.stderr[-3000:]
    reason = "this run finished, but its model is missing or damaged"
    assert f"error: {reason}" in proc.stderr
    told = f"error: process 0 of the run stopped it, and with it process 1: {reason}"
    assert told in proc.stderr, proc.stderr[-3000:]
    assert files(run_dir) == before


def test_undefined_correlations_are_no_score_in_the_cards_model_index(tmp_path: Path) -> None:
    """STS-B dev pairs all scored alike leave Pearson's and Spearman's r undefined (NaN) whatever the model predicts:
    the card's model-index gave the Hub `value: .nan` for each, as scores the model reached. The model-index leaves
    them out (none left: no model-index); the text's table and warning still say what the run measured and why."""
    glue = stsb_with_one_gold_score(tmp_path / "glue_data")
    out = tmp_path / "run"
    proc = run_app(["task=stsb", f"data.dir={glue}", "model=tiny", "data.max_seq_length=32", "train.max_steps=2",
                    "train.progress_bar=false", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(out)
    assert math.isnan(results["pearson"]) and math.isnan(results["objective"])
    text = (out / "model" / "README.md").read_text()
    assert "nan" not in text.split("\n---\n")[0].lower()  # the metadata block
    card = ModelCard.load(out / "model" / "README.md")
    assert not card.data.eval_results and "model-index" not in card.data.to_dict()
    assert card.data.datasets == ["nyu-mll/glue"] and card.data.metrics == ["pearson", "spearmanr", "combined_score"]
    assert "| pearson | nan |" in card.text and "the correlations with it are undefined (NaN)" in card.text


def test_the_cards_use_predicts_what_the_runs_evaluation_predicted(tmp_path: Path) -> None:
    """RTE's premises run past data.max_seq_length=64 tokens, which the run's evaluation cut them to: pipeline on the
    exported model, as a card without a word of it left users to call it, scored them whole (other probabilities) or
    failed past the model's positions. The card's call, run as it says, gives each dev example's probabilities as
    eval_predictions/ has them."""
    from transformers import pipeline

    out = tmp_path / "run"
    proc = run_app(["task=rte", f"data.dir={GLUE_DATA}", "model=tiny", "data.max_seq_length=64", "train.batch_size=16",
                    "data.max_train_samples=64", "data.max_eval_samples=16", "train.max_steps=2", "precision=fp32",
                    "train.progress_bar=false", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = ModelCard.load(out / "model" / "README.md").text
    call = 'predict({"text": sentence1, "text_pair": sentence2}, truncation=True, max_length=64, top_k=None)'
    assert 'pipeline("text-classification", model="path/to/this/model")' in text and call in text
    predict = pipeline("text-classification", model=str(out / "model"))
    rows = [json.loads(line) for line in (out / "eval_predictions" / "validation.jsonl").read_text().splitlines()]
    for row in rows:  # the card's call, as it reads
        scored = predict({"text": row["sentence1"], "text_pair": row["sentence2"]}, truncation=True, max_length=64,
                         top_k=None)
        assert {each["label"]: each["score"] for each in scored} == pytest.approx(
            {label: row[f"probability_{label}"] for label in ("entailment", "not_entailment")}, abs=1e-5)


def test_a_continued_runs_card_keeps_the_warnings_of_a_best_checkpoint_from_before(tmp_path: Path) -> None:
    """Continued past its end, a run whose best checkpoint came from its first attempt wrote a card without its
    Warnings: the card described the best's evaluation as the checkpoint kept it, without the predictions its
    warnings come from, while results.json, evaluating the export again, still gave them."""
    run_dir = tmp_path / "run"
    # Two examples of three labels: a label without a gold example, a warning of every evaluation; a learning rate
    # that changes no prediction, so that the best stays the first attempt's first evaluation.
    args = [*FAST, "optimizer.lr=1e-30", "data.max_eval_samples=2", f"hydra.run.dir={run_dir}"]
    assert run_app(args, cwd=tmp_path).returncode == 0
    card = (run_dir / "model" / "README.md").read_text()
    assert read_results(run_dir)["warnings"] and "## Warnings" in card
    more = run_app([*args, "train.max_steps=18", "train.accept_changes=[train.max_steps]"], cwd=tmp_path)
    assert more.returncode == 0, more.stdout + more.stderr
    results = read_results(run_dir)
    assert results["train_steps"] == 18 and results["best_step"] == 6  # the best from the first attempt
    card = (run_dir / "model" / "README.md").read_text()
    assert "## Warnings" in card and all(warning in card for warning in results["warnings"]), card
