"""The word embeddings' gradient written into one buffer kept for the whole run.

A step touches a few hundred of the vocabulary's rows, but torch's embedding backward returns a
dense gradient, a fresh (vocabulary x width) tensor every step: 47 MB for BERT's 30,522 x 384, 206
MB for RoBERTa-large's. On the CPU glibc maps a block that large anew each time, so the kernel
zeroes it page by page on first touch (11,400 page faults, about 10 ms a step on two cores of a
Xeon), before a single row is added. Here the gradient goes into a buffer allocated once and
zeroed in place each step (its pages stay mapped), and the rows are added in the order torch adds
them, so the gradient is the same bit for bit, also where micro-batches accumulate.

The buffer becomes the weight's ``.grad`` directly, not through autograd's accumulation, so the
weight has no gradient hook: not for DistributedDataParallel, whose reducer waits for those hooks
(:func:`nli.model.fastpaths.install` leaves this path out of distributed runs).
"""

from __future__ import annotations

import types
from typing import Any, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

_BUFFER = "_nli_gradient_buffer"  # the embedding's attribute holding its _Buffer


def applies(embedding: nn.Embedding) -> bool:
    """A plain trained lookup: no max_norm (which renormalises the weight in the forward), no
    sparse or frequency-scaled gradient."""
    return (isinstance(embedding, nn.Embedding) and embedding.weight.requires_grad and embedding.max_norm is None
            and not embedding.sparse and not embedding.scale_grad_by_freq)


def install(embedding: nn.Embedding) -> bool:
    """Give ``embedding`` the forward below where it :func:`applies`; True if it did."""
    if not applies(embedding):
        return False
    object.__setattr__(embedding, _BUFFER, _Buffer())  # a plain attribute (nn.Module's setter types tensors)
    embedding.forward = types.MethodType(_forward, embedding)  # type: ignore[method-assign]
    return True


def _forward(embedding: nn.Embedding, ids: Tensor) -> Tensor:
    """:class:`_Lookup` where a gradient is wanted, else torch's own lookup."""
    if not (torch.is_grad_enabled() and embedding.weight.requires_grad):
        return F.embedding(ids, embedding.weight, embedding.padding_idx)
    return _Lookup.apply(ids, embedding.weight, embedding.padding_idx, getattr(embedding, _BUFFER))


class _Buffer:
    """The gradient's storage, allocated once."""

    def __init__(self) -> None:
        self.grad: Optional[Tensor] = None

    def zeros(self, weight: Tensor) -> Tensor:
        """The buffer, zeroed (all of it: clipping by a NaN norm would have scaled every row), for a
        weight whose gradient was set to None."""
        if self.grad is None or (self.grad.shape, self.grad.dtype, self.grad.device) != (weight.shape, weight.dtype,
                                                                                      weight.device):
            self.grad = torch.zeros_like(weight, memory_format=torch.contiguous_format)
        else:
            self.grad.zero_()
        return self.grad


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ids: Tensor, weight: Tensor, padding_idx: Optional[int], buffer: _Buffer) -> Tensor:
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        ids, weight, padding_idx, buffer = inputs
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx, ctx.buffer = weight, padding_idx, buffer

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[None, None, None, None]:
        (ids,) = ctx.saved_tensors
        weight, buffer = ctx.weight, ctx.buffer
        ids, rows = ids.reshape(-1), grad.reshape(-1, weight.shape[1])
        if ctx.padding_idx is not None:  # torch adds nothing for the padding id
            kept = ids != ctx.padding_idx
            ids, rows = ids[kept], rows[kept]
        with torch.no_grad():
            _accumulate(weight, buffer, ids, rows)
        return None, None, None, None


def _accumulate(weight: Tensor, buffer: _Buffer, ids: Tensor, rows: Tensor) -> None:
    """Add ``rows`` at ``ids`` to ``weight``'s gradient, as torch's backward and accumulation would."""
    if weight.grad is None:  # the step's first micro-batch: each row is 0 + its tokens' rows, in token order
        weight.grad = buffer.zeros(weight).index_add_(0, ids, rows)
        return
    if weight.grad is buffer.grad:
        # A later micro-batch: torch adds a dense tensor whose rows are 0 + this batch's rows in token order.
        # Adding those sums to the touched rows alone is the same: the other rows would add exact zeros,
        # which could only turn a -0.0 into +0.0, and sums begun at +0.0 never give -0.0.
        touched, where = torch.unique(ids, return_inverse=True)
        weight.grad.index_add_(0, touched, rows.new_zeros(len(touched), rows.shape[1]).index_add_(0, where, rows))
    else:  # e.g. a tied weight whose other use accumulated first: torch's own dense sum
        weight.grad.add_(rows.new_zeros(weight.shape).index_add_(0, ids, rows))
