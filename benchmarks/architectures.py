"""The shapes of the Hub checkpoints that conf/model/ names, as their ``config.json`` gives them: enough to
build the same network with random weights, offline (these machines cannot reach the Hub).

    from benchmarks.architectures import hub_config
    config = hub_config("microsoft/deberta-v3-large", num_hidden_layers=2)   # two of its 24 layers

Only what changes a network's shapes or what its forward pass keeps is here (widths, depths, vocabulary,
positions, the attention's layout, dropout); tokenizers and weights are not. Every ``name_or_path`` of
conf/model/*.yaml has an entry (tests/benchmarks/test_memory.py checks it, and checks each entry's parameter count
against the count its conf/model file states).
"""

from __future__ import annotations

from typing import Any, Dict

from transformers import AutoConfig, PretrainedConfig

_BERT = {"model_type": "bert", "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2}
_ROBERTA = {"model_type": "roberta", "vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1,
            "layer_norm_eps": 1e-5, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
_ELECTRA = {"model_type": "electra", "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2}
# DeBERTa-v3 is transformers' model type deberta-v2: relative positions in 256 log buckets, shared keys.
_DEBERTA_V3 = {"model_type": "deberta-v2", "vocab_size": 128100, "max_position_embeddings": 512, "type_vocab_size": 0,
               "relative_attention": True, "position_buckets": 256, "max_relative_positions": -1,
               "norm_rel_ebd": "layer_norm", "share_att_key": True, "pos_att_type": ["p2c", "c2p"],
               "position_biased_input": False, "layer_norm_eps": 1e-7}
# ModernBERT: global attention every third layer, a 128-token window in the others; no dropout.
_MODERNBERT = {"model_type": "modernbert", "vocab_size": 50368, "max_position_embeddings": 8192,
               "global_attn_every_n_layers": 3, "local_attention": 128, "classifier_pooling": "mean"}


WIDTHS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")  # as transformers names them


def widths(hidden: int, layers: int, heads: int, intermediate: int) -> Dict[str, int]:
    """An encoder's widths: hidden size, layers, attention heads, feed-forward width."""
    return dict(zip(WIDTHS, (hidden, layers, heads, intermediate)))


HUB: Dict[str, Dict[str, Any]] = {
    "google-bert/bert-base-uncased": {**_BERT, **widths(768, 12, 12, 3072)},
    "google-bert/bert-large-uncased": {**_BERT, **widths(1024, 24, 16, 4096)},
    "FacebookAI/roberta-base": {**_ROBERTA, **widths(768, 12, 12, 3072)},
    "FacebookAI/roberta-large": {**_ROBERTA, **widths(1024, 24, 16, 4096)},
    "FacebookAI/roberta-large-mnli": {**_ROBERTA, **widths(1024, 24, 16, 4096)},
    "distilbert/distilroberta-base": {**_ROBERTA, **widths(768, 6, 12, 3072)},
    "google/electra-base-discriminator": {**_ELECTRA, "embedding_size": 768, **widths(768, 12, 12, 3072)},
    "google/electra-large-discriminator": {**_ELECTRA, "embedding_size": 1024, **widths(1024, 24, 16, 4096)},
    "microsoft/deberta-v3-xsmall": {**_DEBERTA_V3, **widths(384, 12, 6, 1536)},
    "microsoft/deberta-v3-small": {**_DEBERTA_V3, **widths(768, 6, 12, 3072)},
    "microsoft/deberta-v3-base": {**_DEBERTA_V3, **widths(768, 12, 12, 3072)},
    "microsoft/deberta-v3-large": {**_DEBERTA_V3, **widths(1024, 24, 16, 4096)},
    "MoritzLaurer/DeBERTa-v3-base-mnli": {**_DEBERTA_V3, **widths(768, 12, 12, 3072)},
    "answerdotai/ModernBERT-base": {**_MODERNBERT, **widths(768, 22, 12, 1152)},
    "answerdotai/ModernBERT-large": {**_MODERNBERT, **widths(1024, 28, 16, 2624)},
}


def hub_config(name: str, **changes: Any) -> PretrainedConfig:
    """The config of the Hub checkpoint ``name`` (a key of :data:`HUB`), with ``changes`` (fewer layers, the
    task's labels) applied."""
    if name not in HUB:
        raise KeyError(f"no architecture known for {name!r}: add its config.json's shapes to "
                       f"benchmarks/architectures.py (known: {', '.join(sorted(HUB))})")
    fields = {**HUB[name], **changes}
    return AutoConfig.for_model(fields.pop("model_type"), **fields)
