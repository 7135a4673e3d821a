"""Optimizer (any torch.optim class named by the config) and learning-rate schedule."""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from transformers import get_scheduler

from nli.config import OptimizerConfig, ScheduleConfig, ScheduleName

# transformers' schedule names for ours; each warms up linearly first.
SCHEDULES = {ScheduleName.linear: "linear", ScheduleName.cosine: "cosine",
             ScheduleName.constant: "constant_with_warmup"}


def param_groups(model: torch.nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    """Weight decay on weight matrices only: biases and LayerNorm parameters (every 1-d
    tensor in these models) are not decayed, as in BERT and RoBERTa."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(cfg: OptimizerConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    node = OmegaConf.structured(cfg)
    return instantiate(node, params=param_groups(model, cfg.weight_decay), _convert_="all")


def build_scheduler(cfg: ScheduleConfig, optimizer: torch.optim.Optimizer,
                    total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    return get_scheduler(SCHEDULES[cfg.name], optimizer, num_warmup_steps=cfg.num_warmup_steps(total_steps),
                         num_training_steps=total_steps)
