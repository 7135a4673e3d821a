"""The optimizer's parameter groups: layer-wise learning-rate decay and the head's own rate, on every
supported family's real module layout, crossed with no weight decay on biases and norms."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForSequenceClassification
from transformers.modeling_outputs import SequenceClassifierOutput

from nli.config.schema import (
    AdamConfig,
    LoraConfig,
    SGDConfig,
)
from nli.errors import ConfigError
from nli.model import lora
from nli.model.build import build_model, unwrap
from nli.train.loop import training_loss
from nli.train.optim import build_optimizer, build_scheduler, depth_rates, param_groups
from tests.conftest import build_config
from tests.support.families import FAMILIES, LAYERS, small_model
from tests.support.runs import FAST, read_results, run_app

LR, DECAY, HEAD = 1e-3, 0.8, 2.0


def adamw(**changes: float) -> AdamConfig:
    return AdamConfig(_target_="torch.optim.AdamW", lr=LR, weight_decay=0.01, **changes)


def expected_rate(name: str) -> float:
    """Written out for each part by name, independently of nli.train.optim's patterns."""
    if match := re.search(r"\.layers?\.(\d+)\.", name):
        return LR * DECAY ** (LAYERS - int(match[1]))  # the top layer (LAYERS - 1): one factor of the decay
    if "embeddings" in name or ".encoder.LayerNorm." in name:
        return LR * DECAY ** (LAYERS + 1)
    if "final_norm" in name:  # ModernBERT's norm after the last layer: the top layer's rate
        return LR * DECAY
    assert name.startswith(("classifier.", "pooler.", "head.", "pre_classifier.", "bert.pooler.")), name
    return LR * HEAD


@pytest.mark.parametrize("family", FAMILIES)
def test_each_depth_gets_its_rate(family: str) -> None:
    model = small_model(family)
    rates = depth_rates(model, adamw(layer_decay=DECAY, head_lr_scale=HEAD))
    assert set(rates) == {name for name, _ in model.named_parameters()}
    for name, rate in rates.items():
        assert rate == pytest.approx(expected_rate(name)), name
    top = [rate for name, rate in rates.items() if f".{LAYERS - 1}." in name]
    assert top and all(rate == pytest.approx(LR * DECAY) for rate in top)  # not DECAY**2 (electra#51)


def test_groups_cross_rates_with_no_weight_decay_and_the_schedule_scales_them_once() -> None:
    model = small_model("electra")
    cfg = adamw(layer_decay=DECAY, head_lr_scale=HEAD)
    optimizer = build_optimizer(cfg, model)
    names = {id(param): name for name, param in model.named_parameters()}
    for group in optimizer.param_groups:
        for param in group["params"]:
            assert group["lr"] == pytest.approx(expected_rate(names[id(param)]))
            assert group["weight_decay"] == (0.01 if param.ndim >= 2 else 0.0)
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(names)
    base = [group["lr"] for group in optimizer.param_groups]
    schedule = build_scheduler(build_config(["schedule=linear", "schedule.warmup_ratio=0"]).schedule, optimizer, 10)
    for step in range(1, 4):
        optimizer.step()
        schedule.step()
        # Every rate is its own base rate times the schedule's factor: decayed once, not again at each step.
        assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([b * (1 - step / 10) for b in base])


@pytest.mark.parametrize("family", FAMILIES)
def test_under_lora_each_adapter_gets_its_layers_rate_and_the_head_copy_the_heads(family: str) -> None:
    """peft adds to the names (lora_A.default, modules_to_save.default): layer i's adapters are at layer i's
    depth and the head's trainable copy at the head's rate; only what trains is in a group."""
    model = lora.apply(small_model(family), LoraConfig())
    optimizer = build_optimizer(adamw(layer_decay=DECAY, head_lr_scale=HEAD), model)
    names = {id(param): name for name, param in unwrap(model).named_parameters()}
    grouped = {names[id(param)]: group["lr"] for group in optimizer.param_groups for param in group["params"]}
    assert set(grouped) == {name for name, param in unwrap(model).named_parameters() if param.requires_grad}
    assert any(".lora_A." in name for name in grouped) and any(".modules_to_save." in name for name in grouped)
    for name, rate in grouped.items():
        family_name = re.sub(r"\.(lora_[AB]|modules_to_save)\.default\.", ".", name)  # as the plain model names it
        assert rate == pytest.approx(expected_rate(family_name)), name
    top = [rate for name, rate in grouped.items() if f".{LAYERS - 1}." in name]
    assert top and all(rate == pytest.approx(LR * DECAY) for rate in top)


def test_without_layer_decay_there_are_two_groups_at_one_rate() -> None:
    optimizer = build_optimizer(adamw(), small_model("bert"))
    assert [(group["lr"], group["weight_decay"]) for group in optimizer.param_groups] == [(LR, 0.01), (LR, 0.0)]


def test_head_lr_scale_alone_raises_only_the_head() -> None:
    model = small_model("roberta")
    rates: Dict[str, float] = depth_rates(model, adamw(head_lr_scale=HEAD))
    assert {name for name, rate in rates.items() if rate != LR} == {
        "classifier.dense.weight", "classifier.dense.bias", "classifier.out_proj.weight", "classifier.out_proj.bias"}


def test_a_family_whose_layout_is_unknown_is_refused_by_name() -> None:
    config = AutoConfig.for_model("gpt2", vocab_size=64, n_embd=16, n_layer=2, n_head=2, num_labels=3,
                                  pad_token_id=0)
    model = AutoModelForSequenceClassification.from_config(config)
    with pytest.raises(ConfigError, match=r"cannot tell where transformer\.wte\.weight of this gpt2 model sits"):
        build_optimizer(adamw(layer_decay=DECAY), model)
    assert isinstance(build_optimizer(adamw(), model), torch.optim.AdamW)  # one rate needs no layout


@pytest.mark.parametrize("override, message", [
    ("optimizer.layer_decay=0", "optimizer.layer_decay=0.0 must be in (0, 1]"),
    ("optimizer.layer_decay=1.5", "optimizer.layer_decay=1.5 must be in (0, 1]"),
    ("optimizer.head_lr_scale=0", "optimizer.head_lr_scale=0.0 must be positive"),
])
def test_impossible_rates_are_refused_at_composition(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config([override])


# ------------------------------------------------------------------ head dropout, label smoothing


@pytest.mark.parametrize("family", FAMILIES)
def test_classifier_dropout_reaches_each_familys_head(family: str, tmp_path: Path) -> None:
    small_model(family).save_pretrained(tmp_path)
    cfg = build_config(["task=mnli", "model=bert-base", f"model.name_or_path={tmp_path}",
                        "model.classifier_dropout=0.37", "model.attention=eager"])
    model = build_model(cfg.model, cfg.task, tokenizer=None)  # a checkpoint's model needs no tokenizer here
    head = {name: module.p for name, module in model.named_modules() if isinstance(module, torch.nn.Dropout)
            and not re.search(r"embeddings|layers?\.\d+|encoder", name)}
    assert head and 0.37 in head.values(), head
    assert all(p != 0.37 for name, module in model.named_modules() if isinstance(module, torch.nn.Dropout)
               and re.search(r"layers?\.\d+", name) for p in [module.p])  # the encoder's own dropout is untouched


def test_a_family_without_the_attention_asked_for_is_a_config_error(tmp_path: Path) -> None:
    small_model("deberta-v2").save_pretrained(tmp_path)
    cfg = build_config(["task=mnli", "model=bert-base", f"model.name_or_path={tmp_path}", "model.attention=sdpa"])
    with pytest.raises(ConfigError, match="model.attention=sdpa: transformers has no such attention for deberta-v2 "
                                          "models; set model.attention=eager"):
        build_model(cfg.model, cfg.task, tokenizer=None)


def test_label_smoothing_is_cross_entropy_against_smoothed_labels() -> None:
    torch.manual_seed(0)
    logits, labels = torch.randn(5, 3), torch.tensor([0, 2, 1, 1, 0])
    output = SequenceClassifierOutput(loss=torch.nn.functional.cross_entropy(logits, labels), logits=logits)
    assert training_loss(output, labels, 0.0) is output.loss  # none: the model's own loss, untouched
    smoothed = torch.full((5, 3), 0.1 / 3).scatter_(1, labels[:, None], 1 - 0.1 + 0.1 / 3)
    by_hand = -(smoothed * logits.log_softmax(-1)).sum(-1).mean()
    assert training_loss(output, labels, 0.1).item() == pytest.approx(by_hand.item(), rel=1e-6)


def test_a_run_with_layer_decay_head_rate_smoothing_head_dropout_and_checkpointing(tmp_path: Path) -> None:
    """Through train.py: the optimizer in the checkpoint has the rates of the quickstart's depths."""
    proc = run_app([*FAST, "optimizer.layer_decay=0.5", "optimizer.head_lr_scale=4", "train.label_smoothing=0.1",
                      "model.classifier_dropout=0.2", "schedule.warmup_ratio=0", "train.gradient_checkpointing=true",
                      f"hydra.run.dir={tmp_path}"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 0 <= read_results(tmp_path)["accuracy"] <= 1
    assert "fast paths: off, as train.gradient_checkpointing recomputes the stock layers" in proc.stdout
    (state,) = sorted(tmp_path.glob("checkpoints/step-*/state.pt"))[-1:]
    groups = torch.load(state, weights_only=False)["parts"]["optimizer"]["param_groups"]
    initial = sorted({group["initial_lr"] for group in groups})
    layers = build_config(FAST).model.scratch.num_hidden_layers
    assert initial == pytest.approx(sorted({1e-3 * 0.5 ** k for k in range(1, layers + 2)} | {1e-3 * 4}))


def _tiny_model() -> torch.nn.Module:
    config = AutoConfig.for_model("roberta", vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32, num_labels=3)
    return AutoModelForSequenceClassification.from_config(config)


def test_no_weight_decay_on_biases_and_layernorm() -> None:
    model = _tiny_model()
    decay, no_decay = param_groups(model, AdamConfig(_target_="torch.optim.AdamW", lr=1e-3, weight_decay=0.1))
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


@pytest.mark.parametrize("schedule,transformers_name", [("linear", "linear"), ("cosine", "cosine"),
                                                        ("constant", "constant_with_warmup")])
@pytest.mark.parametrize("warmup,total", [(3, 10), (0, 7), (4, 4), (1, 1000)])
def test_each_schedule_is_the_transformers_schedule_it_names(schedule: str, transformers_name: str, warmup: int,
                                                             total: int) -> None:
    """conf/schedule/ picks its function by _target_, as optimizers and loggers do: the learning rates
    are transformers' own to the last bit, warm-up included (nli.train.optim writes them out, since
    transformers.optimization imports its Trainer's utilities), and a checkpoint holds the same state."""
    from tests.conftest import build_config

    cfg = build_config([f"schedule={schedule}", f"schedule.warmup_steps={warmup}"]).schedule

    def rates(make) -> Tuple[List[float], Dict[str, Any]]:
        optimizer = torch.optim.SGD(_tiny_model().parameters(), lr=0.1)
        scheduler, seen = make(optimizer), []
        for _ in range(min(total, 60)):
            seen.append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
        return seen, scheduler.state_dict()

    ours, our_state = rates(lambda optimizer: build_scheduler(cfg, optimizer, total_steps=total))
    theirs, their_state = rates(lambda optimizer: transformers.get_scheduler(
        transformers_name, optimizer, num_warmup_steps=warmup, num_training_steps=total))
    assert ours == theirs and (max(ours) == pytest.approx(0.1)) == (warmup < total) and (ours[0] == 0.0) == (warmup > 0)
    assert our_state == their_state
    _, fresh = rates(lambda optimizer: build_scheduler(cfg, optimizer, total_steps=total))
    resumed = build_scheduler(cfg, torch.optim.SGD(_tiny_model().parameters(), lr=0.1), total_steps=total)
    resumed.load_state_dict(their_state)  # a checkpoint written while transformers built the schedule
    assert resumed.get_last_lr() == fresh["_last_lr"]


def test_a_schedule_target_that_names_no_function_is_refused_by_its_key() -> None:
    from tests.conftest import build_config

    cfg = build_config(["schedule=linear"]).schedule
    with pytest.raises(ConfigError, match="schedule._target_=nli.train.optim.nowhere names no function"):
        build_scheduler(dataclasses.replace(cfg, _target_="nli.train.optim.nowhere"), torch.optim.SGD(
            _tiny_model().parameters(), lr=0.1), total_steps=10)
