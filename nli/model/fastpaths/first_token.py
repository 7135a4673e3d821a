"""The last encoder layer computed for the first token alone.

BERT's and RoBERTa's sequence-classification heads read one vector: the first token's
(``[CLS]``, ``<s>``) in the last layer's output. Every other position of that layer is computed
and thrown away. Here the last layer's queries, attention output and feed-forward block run on
the first token only; keys and values still come from every token. The logits are the same (to
float rounding) and the weights and their names are untouched, so checkpoints and exports are
unchanged. It saves a sixth of the matrix FLOPs of a 6-layer MiniLM, a twelfth of BERT-base's
and a 24th of RoBERTa-large's, in training and evaluation alike.
"""

from __future__ import annotations

import logging
import types
from typing import Any, Optional

import torch
from transformers import PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward  # RoBERTa's is the same code

from nli.model.fastpaths.cpu_dropout import ATTENTION as CPU_DROPOUT_ATTENTION

log = logging.getLogger(__name__)

# Heads that read the first token of the last layer, in encoders laid out as BERT is.
HEADS = {"BertForSequenceClassification", "RobertaForSequenceClassification",
         "XLMRobertaForSequenceClassification", "CamembertForSequenceClassification"}
# Attention functions given a 4-D mask (batch, heads or 1, queries, keys), whose query rows can be sliced.
ATTENTIONS = {"sdpa", "eager", CPU_DROPOUT_ATTENTION}
# A BertEncoder, BertLayer or BertSelfAttention, or the same module of a model above (the same code in
# unrelated classes), used through its attributes, which nn.Module types as "a Tensor or a Module".
BertModule = Any


def install(model: PreTrainedModel) -> bool:
    """Make ``model``'s last layer compute the first token alone, where its head reads only that
    token and its attention takes a 4-D mask. True if it did."""
    if not applies(model):
        return False
    layer = model.base_model.encoder.layer[-1]
    layer.forward = types.MethodType(_first_token_forward, layer)
    log.debug("last layer: the first token alone")
    return True


def applies(model: PreTrainedModel) -> bool:
    """``model``'s head reads the first token of an encoder laid out as BERT's, whose attention
    takes a 4-D mask."""
    return type(model).__name__ in HEADS and model.config._attn_implementation in ATTENTIONS


def attend(attention: BertModule, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``attention``'s (a BertSelfAttention) configured attention function on these heads:
    (batch, queries, heads, head width)."""
    function = ALL_ATTENTION_FUNCTIONS.get_interface(attention.config._attn_implementation, eager_attention_forward)
    context, _ = function(attention, query, key, value, mask, scaling=attention.scaling,
                          dropout=attention.dropout.p if attention.training else 0.0)
    return context


def _first_token_forward(layer: BertModule, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                         *args: Any, **kwargs: Any) -> torch.Tensor:
    """BertLayer.forward (RoBERTa's is the same) with queries from the first position only."""
    attention = layer.attention.self
    batch, first = hidden_states.shape[0], hidden_states[:, :1]
    heads = (batch, -1, attention.num_attention_heads, attention.attention_head_size)
    query = attention.query(first).view(heads).transpose(1, 2)
    key = attention.key(hidden_states).view(heads).transpose(1, 2)
    value = attention.value(hidden_states).view(heads).transpose(1, 2)
    mask = attention_mask[:, :, :1] if attention_mask is not None else None
    context = attend(attention, query, key, value, mask)
    attention_output = layer.attention.output(context.reshape(batch, 1, -1), first)
    return layer.feed_forward_chunk(attention_output)
