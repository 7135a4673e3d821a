"""Encoder layers that compute on real tokens only, for training and evaluating on the CPU.

A batch padded to its longest example computes every layer's matrix products, layer norms,
activations and dropout on its padding too. Here the real tokens are gathered into one
(tokens, width) matrix before the first layer and stay there; only attention, which needs each
sequence's keys side by side, sees them spread back into (batch, length) form for the moment it
runs. The logits are the same (to float rounding) and the weights and their names are untouched.

CPU only: finding the real tokens (``nonzero``) would make a GPU wait for the host at every
forward, which costs more there than the padding it saves.
"""

from __future__ import annotations

import logging
import types
from typing import Any, Optional, Tuple

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

from nli.model.fastpaths.first_token import BertModule, applies, attend

log = logging.getLogger(__name__)

ROWS = 64  # in bf16, the rows the layers compute are a multiple of this (or the whole padded batch)


def install(model: PreTrainedModel) -> bool:
    """Make ``model``'s encoder skip padding, where it is laid out as BERT's and its attention
    takes a 4-D mask (the encoders :mod:`nli.model.fastpaths.first_token` applies to). True if it did."""
    if not applies(model):
        return False
    encoder = model.base_model.encoder
    encoder.forward = types.MethodType(_encoder_forward, encoder)
    log.debug("encoder: real tokens only")
    return True


def _encoder_forward(encoder: BertModule, hidden_states: Tensor, attention_mask: Optional[Tensor] = None, *args: Any,
                     **kwargs: Any) -> BaseModelOutputWithPastAndCrossAttentions:
    real = _real_tokens(attention_mask)
    if real is None:  # nothing to skip, or padding on the left: BertEncoder.forward as it is
        return type(encoder).forward(encoder, hidden_states, attention_mask, *args, **kwargs)
    return BaseModelOutputWithPastAndCrossAttentions(
        last_hidden_state=_encode(encoder.layer, hidden_states, attention_mask, real))


def _real_tokens(mask: Optional[Tensor]) -> Optional[Tensor]:
    """(batch, length), True at real tokens, from the encoder's 4-D mask (SDPA's booleans or
    eager's 0 / -inf), in which every query row is the same; None without padding on the right."""
    if mask is None or mask.dim() != 4:
        return None
    row = mask[:, 0, 0]
    real = row if row.dtype == torch.bool else row == 0
    return real if bool(real[:, 0].all()) and not bool(real.all()) else None


def _encode(layers: nn.ModuleList, hidden: Tensor, mask: Optional[Tensor], real: Tensor) -> Tensor:
    """The encoder's last hidden state, every layer but the last on real tokens alone."""
    shape = (hidden.shape[0], hidden.shape[1])
    index = _rows(real)
    tokens = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)
    for layer in layers[:-1]:
        tokens = _layer(layer, tokens, index, mask, shape)
    # The last layer as installed: for a classifier, its first token alone (nli.model.fastpaths.first_token).
    return layers[-1](_spread(tokens, index, shape), mask)


def _rows(real: Tensor) -> Tensor:
    """The places in batch x length of the rows the layers compute: every real token, then padding
    places up to a multiple of :data:`ROWS` where the matrix products run in bf16 (oneDNN builds a
    kernel for each new shape: about 5 ms each, more than a step's few dozen padding rows cost). A
    padding row is a key no query attends to and a query whose output is dropped: its gradient is zero."""
    flat = real.reshape(-1)
    index = flat.nonzero().squeeze(1)
    if not _bf16_products():
        return index
    extra = min(-len(index) % ROWS, len(flat) - len(index))
    return torch.cat([index, (~flat).nonzero().squeeze(1)[:extra]]) if extra else index


def _bf16_products() -> bool:
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def _layer(layer: BertModule, tokens: Tensor, index: Tensor, mask: Optional[Tensor], shape: Tuple[int, int]) -> Tensor:
    """BertLayer.forward (RoBERTa's is the same) on (tokens, width)."""
    attention = layer.attention.self

    def heads(x: Tensor) -> Tensor:  # (tokens, width) -> (batch, heads, length, head width)
        return _spread(x, index, shape).view(*shape, -1, attention.attention_head_size).transpose(1, 2)

    context = attend(attention, heads(attention.query(tokens)), heads(attention.key(tokens)),
                                 heads(attention.value(tokens)), mask)  # (batch, length, heads, head width)
    context = context.reshape(-1, attention.all_head_size).index_select(0, index)
    return layer.feed_forward_chunk(layer.attention.output(context, tokens))


def _spread(tokens: Tensor, index: Tensor, shape: Tuple[int, int]) -> Tensor:
    """(tokens, features) back to (batch, length, features), zeros at the padding."""
    out = tokens.new_zeros(shape[0] * shape[1], tokens.shape[-1]).index_copy(0, index, tokens)
    return out.view(*shape, -1)
