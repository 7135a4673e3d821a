"""Dropout for training on the CPU: the mask costs about a third of what torch's does.

torch's CPU dropout draws a Bernoulli sample per element (~12 ns each on two cores), and dropout
on the attention probabilities takes ``scaled_dot_product_attention`` off its fused kernel onto
a slower unfused path. Here each element's keep/drop decision is 16 bits of one 32-bit random
draw (two elements per draw), compared with a threshold: the drop probability is ``p`` to within
2**-16, and the random numbers still come from torch's seeded generator (runs stay reproducible
and resume where they stopped). Evaluation, and training without dropout, run exactly the code they
ran before. What it saves per step: ``benchmarks/RESULTS.md``.

Nothing is registered on import: :func:`install` registers the attention function with transformers
(once) before the model uses it.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

ATTENTION = "sdpa_cpu_dropout"  # transformers' name for the attention function below


def keep_mask(shape: torch.Size, p: float) -> Tensor:
    """True where an element is kept: each with probability 1 - p (to within 2**-16)."""
    n = math.prod(shape)
    words = torch.empty((n + 1) // 2, dtype=torch.int32).random_(-2**31, None)  # all 32 bits random
    halves = words.view(torch.int16)[:n]  # uniform on [-2**15, 2**15)
    return halves.view(shape) >= round(p * 2**16) - 2**15


def drop(x: Tensor, p: float) -> Tensor:
    """``x`` with each element zeroed with probability ``p`` and the rest scaled by 1 / (1 - p)."""
    return torch.where(keep_mask(x.shape, p), x * (1 / (1 - p)), 0.0)


class CpuDropout(nn.Dropout):
    """``nn.Dropout`` with :func:`drop` in training."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        return drop(x, self.p)


def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
              dropout: float = 0.0, scaling: Optional[float] = None, **kwargs: Any) -> Tuple[Tensor, None]:
    """transformers' SDPA attention, with the probabilities' dropout done by :func:`drop`.
    ``attention_mask`` is SDPA's: boolean, True where a query may attend, or None for no padding."""
    if dropout == 0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling,
                                      **kwargs)
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling or query.size(-1) ** -0.5)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    return torch.matmul(drop(torch.softmax(scores, dim=-1), dropout), value).transpose(1, 2).contiguous(), None


def register() -> None:
    """Make :func:`attention` known to transformers as ``ATTENTION``, with SDPA's masks. Idempotent."""
    if ALL_ATTENTION_FUNCTIONS.get(ATTENTION) is not attention:
        AttentionInterface.register(ATTENTION, attention)
    if ALL_MASK_ATTENTION_FUNCTIONS.get(ATTENTION) is not sdpa_mask:
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)  # the same masks SDPA is given


def install(model: PreTrainedModel) -> List[Tuple[nn.Module, str, nn.Dropout]]:
    """Use this module's dropout in ``model``, a model that trains on the CPU: its ``nn.Dropout``
    layers become :class:`CpuDropout` and SDPA attention becomes :func:`attention`. Returns the
    dropout layers replaced, each as (parent, attribute name, the stock layer)."""
    register()
    replaced = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                setattr(parent, name, CpuDropout(child.p, inplace=False))
                replaced.append((parent, name, child))
    if model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(ATTENTION)
    return replaced
