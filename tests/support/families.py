"""Small random-weight models of each encoder family the framework supports, built offline from a
config alone (nothing downloaded): for tests of what depends on a family's module layout."""

from __future__ import annotations

from typing import Any, Dict

from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel

LAYERS = 3
_SMALL: Dict[str, Any] = dict(vocab_size=64, hidden_size=16, num_hidden_layers=LAYERS, num_attention_heads=2,
                              intermediate_size=32, num_labels=3)
# What each family needs besides the common small sizes (DeBERTa-v3 is model type deberta-v2).
FAMILIES: Dict[str, Dict[str, Any]] = {
    "bert": {},
    "roberta": {},
    "electra": {"embedding_size": 8},  # ELECTRA's embeddings are smaller than its hidden size: a projection
    "deberta-v2": {"relative_attention": True, "position_biased_input": False, "pos_att_type": ["p2c", "c2p"],
                   "norm_rel_ebd": "layer_norm", "max_relative_positions": 16, "position_buckets": 8},
    "distilbert": {"dim": 16, "n_layers": LAYERS, "n_heads": 2, "hidden_dim": 32},
    "modernbert": {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2},
}


def small_model(family: str, **changes: Any) -> PreTrainedModel:
    config = AutoConfig.for_model(family, **{**_SMALL, **FAMILIES[family], **changes})
    return AutoModelForSequenceClassification.from_config(config)
