"""The pieces under train.py: metrics, the synthetic task, the optimizer's parameter groups."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
from collections import Counter

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from nli import metrics, synthetic
from nli.config import (AdamConfig, Attention, ConfigError, ModelConfig, SGDConfig, ScratchArchitecture,
                        TaskConfig)
from nli.model import build_model, train_bpe_tokenizer
from nli.optim import build_optimizer, param_groups
from nli.signals import StopRequest


def test_metrics_agree_with_hand_computed_values() -> None:
    pred, ref = np.array([1, 0, 1, 1, 0, 1]), np.array([1, 0, 0, 1, 1, 1])
    # tp=3 fp=1 fn=1 tn=1: accuracy 4/6, F1 = 2*3 / (2*3 + 1 + 1) = 0.75,
    # MCC = (3*1 - 1*1) / sqrt(4 * 4 * 2 * 2) = 2 / 8.
    scores = metrics.compute(["accuracy", "f1", "matthews_correlation"], pred, ref)
    assert scores["accuracy"] == pytest.approx(4 / 6)
    assert scores["f1"] == pytest.approx(0.75)
    assert scores["matthews_correlation"] == pytest.approx(0.25)
    assert scores["combined_score"] == pytest.approx(np.mean([4 / 6, 0.75, 0.25]))


def test_correlations_and_split_suffix() -> None:
    pred, ref = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 6.0, 9.0])
    scores = metrics.compute(["pearson", "spearmanr"], pred, ref, suffix="_mm")
    assert scores["spearmanr_mm"] == pytest.approx(1.0)  # same order
    assert scores["pearson_mm"] == pytest.approx(np.corrcoef(pred, ref)[0, 1])
    assert set(scores) == {"pearson_mm", "spearmanr_mm", "combined_score_mm"}


def test_synthetic_task_is_deterministic_and_balanced() -> None:
    a, b = synthetic.generate(3000, seed=0), synthetic.generate(3000, seed=0)
    assert a == b and synthetic.generate(10, seed=1) != synthetic.generate(10, seed=0)
    counts = Counter(a["label"])
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 900
    # Contradictions negate; entailments only repeat the premise's words.
    for premise, hypothesis, label in zip(a["premise"], a["hypothesis"], a["label"]):
        if synthetic.LABELS[label] == "entailment":
            assert set(hypothesis.split()) <= set(premise.split())
        if synthetic.LABELS[label] == "contradiction":
            assert {"not", "nobody"} & set(hypothesis.split())


def _tiny_model() -> torch.nn.Module:
    config = AutoConfig.for_model("roberta", vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32, num_labels=3)
    return AutoModelForSequenceClassification.from_config(config)


def test_no_weight_decay_on_biases_and_layernorm() -> None:
    model = _tiny_model()
    decay, no_decay = param_groups(model, weight_decay=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert any("LayerNorm.weight" in names[id(p)] for p in no_decay["params"])
    assert all(names[id(p)].endswith("weight") and "LayerNorm" not in names[id(p)] for p in decay["params"])


def test_optimizer_class_comes_from_config() -> None:
    model = _tiny_model()
    adamw = build_optimizer(AdamConfig(_target_="torch.optim.AdamW", lr=1e-3, weight_decay=0.1,
                                       betas=[0.9, 0.98], eps=1e-6), model)
    assert isinstance(adamw, torch.optim.AdamW) and list(adamw.defaults["betas"]) == [0.9, 0.98]
    sgd = build_optimizer(SGDConfig(_target_="torch.optim.SGD", lr=0.1, momentum=0.5), model)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.5
    assert adamw.defaults["fused"] is True  # the default: one kernel per update, as the Trainer's adamw_torch_fused
    unfused = build_optimizer(AdamConfig(_target_="torch.optim.AdamW", lr=1e-3, fused=False), model)
    assert not unfused.defaults["fused"]


def test_attention_implementation_comes_from_config() -> None:
    tokenizer = train_bpe_tokenizer(["a small text", "another one"] * 50, vocab_size=300, max_seq_length=32)
    task = TaskConfig(name="t", text_fields=["a", "b"], label_names=["x", "y"], eval_splits={"validation": ""},
                      metrics=["accuracy"], main_metric="accuracy")
    for attention in (Attention.sdpa, Attention.eager):
        model = build_model(ModelConfig(name_or_path=None, scratch=ScratchArchitecture(vocab_size=300),
                                        attention=attention), task, tokenizer)
        assert model.config._attn_implementation == attention.value
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ConfigError, match="needs the flash-attn package"):
            build_model(ModelConfig(name_or_path=None, scratch=ScratchArchitecture(vocab_size=300),
                                    attention=Attention.flash_attention_2), task, tokenizer)


def test_signals_become_a_stop_request_and_a_second_ctrl_c_stops_at_once() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be set from the main thread")
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert stop.signal is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal == "SIGTERM"  # noted, not fatal: the loop stops after its step
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before
