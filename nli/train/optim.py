"""Optimizer (any torch.optim class named by the config) and learning-rate schedule (any function
named by the config with the signature of :func:`linear`)."""

from __future__ import annotations

import math
import re
from functools import partial
from typing import Any, Dict, List, cast

import torch
from hydra.utils import get_method, instantiate
from omegaconf import OmegaConf
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from nli.config.schema import OptimizerConfig, ScheduleConfig
from nli.errors import ConfigError
from nli.model.build import HEAD, unwrap

# optimizer: keys that shape the parameter groups rather than go to the optimizer's class.
GROUP_KEYS = ("layer_decay", "head_lr_scale")
# Where the supported families (BERT, RoBERTa, ELECTRA, DeBERTa, DistilBERT, ModernBERT) keep their
# parts, by parameter name: encoder layer i, the embeddings (with DeBERTa's relative ones and their
# norm), the classification head (nli.model.build.HEAD), and ModernBERT's norm after its last layer.
_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")
_EMBEDDINGS = re.compile(r"(?:^|\.)(?:embeddings|embeddings_project|rel_embeddings)\.|^(?:\w+\.)?encoder\.LayerNorm\.")
_AFTER_LAST_LAYER = re.compile(r"(?:^|\.)final_norm\.")


def param_groups(model: torch.nn.Module, cfg: OptimizerConfig) -> List[Dict[str, Any]]:
    """Weight decay on weight matrices only: biases and LayerNorm parameters (every 1-d tensor in
    these models) are not decayed, as in BERT and RoBERTa. With ``layer_decay`` or ``head_lr_scale``,
    each depth gets its own rate too (:func:`depth_rates`); the schedule then scales every rate alike.
    Frozen parameters (all but the adapters and the head under LoRA) are in no group."""
    rates = depth_rates(model, cfg) if cfg.layer_decay is not None or cfg.head_lr_scale != 1.0 else None
    groups: Dict[tuple[bool, float], List[torch.nn.Parameter]] = {}
    for name, param in unwrap(model).named_parameters():
        if param.requires_grad:
            groups.setdefault((param.ndim >= 2, rates[name] if rates else cfg.lr), []).append(param)
    return [{"params": params, "weight_decay": cfg.weight_decay if decayed else 0.0, "lr": lr}
            for (decayed, lr), params in groups.items()]


def depth_rates(model: torch.nn.Module, cfg: OptimizerConfig) -> Dict[str, float]:
    """Each parameter's learning rate: ``lr x layer_decay^(L + 1 - depth)`` for L layers, where the
    embeddings are at depth 0 and layer i at depth i + 1, so the top layer gets one factor of the
    decay (not two: google-research/electra#51) and the embeddings L + 1; the head gets
    ``lr x head_lr_scale``. Set once: the schedule multiplies these rates, never decays them again.

    Parameters are named as in the transformers model, also under LoRA (nli.model.lora), whose names add to
    them (``...layer.3.attention.self.query.lora_A.default.weight``, ``classifier.modules_to_save...``):
    layer i's adapters are at layer i's depth, the head's trainable copy at the head's rate."""
    model = unwrap(model)
    config: Any = getattr(model, "config", None)
    layers = int(config.num_hidden_layers)  # every supported family's config has it
    decay = cfg.layer_decay if cfg.layer_decay is not None else 1.0
    rates = {}
    for name, _ in model.named_parameters():
        depth = _depth(name, layers, str(config.model_type))
        rates[name] = cfg.lr * cfg.head_lr_scale if depth > layers else cfg.lr * decay ** (layers + 1 - depth)
    return rates


def _depth(name: str, layers: int, model_type: str) -> int:
    if match := _LAYER.search(name):
        return int(match[1]) + 1
    if _EMBEDDINGS.search(name):
        return 0
    if HEAD.search(name):
        return layers + 1
    if _AFTER_LAST_LAYER.search(name):
        return layers
    raise ConfigError(f"optimizer.layer_decay and head_lr_scale cannot tell where {name} of this {model_type} model "
                      "sits (embeddings, which layer, or the head); they know BERT, RoBERTa, ELECTRA, DeBERTa, "
                      "DistilBERT and ModernBERT. Set optimizer.layer_decay=null optimizer.head_lr_scale=1")


def build_optimizer(cfg: OptimizerConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    options = cast(Dict[str, Any], OmegaConf.to_container(OmegaConf.structured(cfg)))
    arguments = {key: value for key, value in options.items() if key not in GROUP_KEYS}
    if arguments.get("fused") and next(model.parameters()).device.type == "xla":
        arguments["fused"] = False  # torch's fused kernels are CPU and GPU ones; XLA fuses the step in its graph
    return instantiate(arguments, params=param_groups(model, cfg), _convert_="all")


def build_scheduler(cfg: ScheduleConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> LRScheduler:
    """The schedule ``cfg._target_`` names, warming up for ``cfg.num_warmup_steps`` of ``total_steps``."""
    try:
        schedule = get_method(cfg._target_)
    except Exception as err:  # Hydra says what it could not import, as ImportError or ValueError
        raise ConfigError(f"schedule._target_={cfg._target_} names no function: {err}") from None
    return schedule(optimizer, warmup_steps=cfg.num_warmup_steps(total_steps), total_steps=total_steps)


# The schedules of conf/schedule/, each with a linear warm-up to optimizer.lr first: transformers'
# get_{linear,cosine,constant}_schedule_with_warmup, factor for factor (tests/nli/train/test_optim.py holds
# them to it), written out because importing transformers.optimization imports its Trainer's utilities, and
# with them peft: seconds of every run's start. Each is a LambdaLR over a functools.partial, as there, so
# that checkpoints hold the same scheduler state.


def linear(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int) -> LRScheduler:
    """Then linear decay to zero (BERT, RoBERTa)."""
    return LambdaLR(optimizer, partial(_linear, warmup=warmup_steps, total=total_steps))


def cosine(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int) -> LRScheduler:
    """Then half a cosine down to zero."""
    return LambdaLR(optimizer, partial(_cosine, warmup=warmup_steps, total=total_steps))


def constant(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int) -> LRScheduler:
    """Then constant."""
    return LambdaLR(optimizer, partial(_constant, warmup=warmup_steps))


def _warming(step: int, warmup: int) -> float:
    return float(step) / float(max(1, warmup))


def _linear(step: int, *, warmup: int, total: int) -> float:
    if step < warmup:
        return _warming(step, warmup)
    return max(0.0, float(total - step) / float(max(1, total - warmup)))


def _cosine(step: int, *, warmup: int, total: int) -> float:
    if step < warmup:
        return _warming(step, warmup)
    progress = float(step - warmup) / float(max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


def _constant(step: int, *, warmup: int) -> float:
    return _warming(step, warmup) if step < warmup else 1.0
