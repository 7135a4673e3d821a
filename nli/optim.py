"""Optimizer (any torch.optim class named by the config) and learning-rate schedule (any function
named by the config with the signature of :func:`linear`)."""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from hydra.utils import get_method, instantiate
from omegaconf import OmegaConf
from torch.optim.lr_scheduler import LRScheduler
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from nli.config import OptimizerConfig, ScheduleConfig
from nli.errors import ConfigError


def param_groups(model: torch.nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    """Weight decay on weight matrices only: biases and LayerNorm parameters (every 1-d
    tensor in these models) are not decayed, as in BERT and RoBERTa."""
    decay: List[torch.nn.Parameter] = []
    no_decay: List[torch.nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(cfg: OptimizerConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    node = OmegaConf.structured(cfg)
    return instantiate(node, params=param_groups(model, cfg.weight_decay), _convert_="all")


def build_scheduler(cfg: ScheduleConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> LRScheduler:
    """The schedule ``cfg._target_`` names, warming up for ``cfg.num_warmup_steps`` of ``total_steps``."""
    try:
        schedule = get_method(cfg._target_)
    except Exception as err:  # Hydra says what it could not import, as ImportError or ValueError
        raise ConfigError(f"schedule._target_={cfg._target_} names no function: {err}") from None
    return schedule(optimizer, warmup_steps=cfg.num_warmup_steps(total_steps), total_steps=total_steps)


# The schedules of conf/schedule/, each with a linear warm-up to optimizer.lr first.


def linear(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int) -> LRScheduler:
    """Then linear decay to zero (BERT, RoBERTa)."""
    return get_linear_schedule_with_warmup(optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


def cosine(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int) -> LRScheduler:
    """Then half a cosine down to zero."""
    return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


def constant(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int) -> LRScheduler:
    """Then constant."""
    return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup_steps)
