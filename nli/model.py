"""Tokenizer and sequence-classification model from config: a pretrained checkpoint (Hub id or
local directory) or an architecture with random weights and a tokenizer learnt from the data."""

from __future__ import annotations

import importlib.util
import json
import logging
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    RobertaTokenizerFast,
)

from nli.config import Attention, ModelConfig, ScratchArchitecture, TaskConfig
from nli.distributed import World
from nli.errors import ConfigError
from nli.hub import hub_download

log = logging.getLogger(__name__)

# RoBERTa's special tokens, in RoBERTa's id order.
SPECIAL_TOKENS = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
                  "mask_token": "<mask>"}

# Model types that number positions from padding_idx + 1 (transformers' create_position_ids_from_input_ids):
# RoBERTa's padding_idx is 1, so a sequence of n tokens takes positions 2 to n + 1.
POSITIONS_AFTER_PADDING = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text",
                                     "ibert", "longformer", "luke", "mpnet", "roberta-prelayernorm", "xmod"})
# What transformers' tokenizers give as model_max_length when the checkpoint sets none (int(1e30)).
UNBOUNDED_LENGTH = 10**29


def _local_dir(name_or_path: str) -> bool:
    """A local checkpoint, or a path meant as one (a Hub id is `name` or `owner/name`)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return True
    looks_like_path = name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1
    if looks_like_path:
        raise ConfigError(f"model.name_or_path={name_or_path} is not a directory; give a local "
                          "checkpoint directory or a Hub id such as FacebookAI/roberta-base")
    return False


def build_tokenizer(cfg: ModelConfig, train_texts: Iterable[str], *,
                    max_seq_length: int) -> PreTrainedTokenizerBase:
    """The model's tokenizer. For a pretrained checkpoint, ``max_seq_length`` is checked first
    against what the checkpoint can take: before tokenizing, and long before the model loads."""
    if cfg.scratch is not None:
        return train_bpe_tokenizer(train_texts, vocab_size=cfg.scratch.vocab_size,
                                   max_seq_length=max_seq_length)
    assert cfg.name_or_path is not None
    # Here rather than in build_model, which is not told max_seq_length: the tokenizer is built first.
    _check_positions(pretrained_config(cfg, what="tokenizer"), cfg, max_seq_length)
    if _local_dir(cfg.name_or_path):
        tokenizer = AutoTokenizer.from_pretrained(cfg.name_or_path)
    else:
        with hub_download(f"tokenizer '{cfg.name_or_path}'"):
            tokenizer = AutoTokenizer.from_pretrained(cfg.name_or_path, revision=cfg.revision)
    limit = tokenizer.model_max_length
    if limit < UNBOUNDED_LENGTH and max_seq_length > limit:
        raise ConfigError(f"data.max_seq_length={max_seq_length} is more than the {limit} tokens the tokenizer of "
                          f"model.name_or_path={cfg.name_or_path} takes (its model_max_length): set "
                          f"data.max_seq_length={limit} or less")
    return tokenizer


def pretrained_config(cfg: ModelConfig, *, what: str = "model") -> PretrainedConfig:
    """The checkpoint's config.json, read without its weights; a local one that is missing or
    unreadable is a ConfigError naming the file. ``what`` it is read for names a failed download."""
    assert cfg.name_or_path is not None
    if not _local_dir(cfg.name_or_path):
        with hub_download(f"{what} '{cfg.name_or_path}'"):
            return AutoConfig.from_pretrained(cfg.name_or_path, revision=cfg.revision)
    path = Path(cfg.name_or_path).expanduser() / "config.json"
    if not path.is_file():
        raise ConfigError(f"model.name_or_path={cfg.name_or_path} has no config.json, so it is not a checkpoint "
                          "directory: point it at a folder that save_pretrained wrote (config.json, the weights "
                          "and the tokenizer's files)")
    try:
        json.loads(path.read_text(encoding="utf-8"))  # transformers' own error names neither line nor cause
        return AutoConfig.from_pretrained(cfg.name_or_path)
    except json.JSONDecodeError as err:
        problem = f", line {err.lineno}: not valid JSON ({err.msg}, column {err.colno})"
    except UnicodeDecodeError:
        problem = ": not UTF-8 JSON text"
    except (OSError, ValueError) as err:  # valid JSON that transformers cannot make a config of
        problem = f": transformers cannot read it: {err}"
    raise ConfigError(f"{path}{problem}. model.name_or_path={cfg.name_or_path} needs the config.json that "
                      "save_pretrained writes: repair it, or copy the checkpoint again")


def _check_positions(config: PretrainedConfig, cfg: ModelConfig, max_seq_length: int) -> None:
    """A sequence longer than the checkpoint's position embeddings would fail in the model's
    forward pass, on the first long example: perhaps only in the final evaluation."""
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int) or getattr(config, "position_biased_input", True) is False:
        return  # no absolute positions (DeBERTa's are relative): the tokenizer's limit is the check
    spare = 0
    if config.model_type in POSITIONS_AFTER_PADDING:
        spare = (config.pad_token_id if isinstance(config.pad_token_id, int) else 1) + 1
    if max_seq_length + spare > positions:
        why = (f"; {config.model_type} numbers positions from padding_idx + 1, so it takes "
               f"data.max_seq_length + {spare}" if spare else "")
        raise ConfigError(f"data.max_seq_length={max_seq_length} does not fit model.name_or_path="
                          f"{cfg.name_or_path}: it has {positions} position embeddings (max_position_embeddings)"
                          f"{why}. Set data.max_seq_length={positions - spare} or less")


def train_bpe_tokenizer(texts: Iterable[str], *, vocab_size: int,
                        max_seq_length: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with RoBERTa's special tokens and pair format
    (``<s> A </s></s> B </s>``), learnt from ``texts`` in about a second."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    bos, eos = SPECIAL_TOKENS["bos_token"], SPECIAL_TOKENS["eos_token"]
    eos_id, bos_id = bpe.token_to_id(eos), bpe.token_to_id(bos)
    assert eos_id is not None and bos_id is not None  # special tokens are in every trained vocabulary
    bpe.post_processor = processors.RobertaProcessing((eos, eos_id), (bos, bos_id))
    # The RoBERTa class gives the saved tokenizer RoBERTa's behaviour under AutoTokenizer.
    return RobertaTokenizerFast(tokenizer_object=bpe, cls_token=bos, sep_token=eos,
                                model_max_length=max_seq_length, **SPECIAL_TOKENS)


def _label_kwargs(task: TaskConfig) -> Dict[str, Any]:
    kwargs: Dict[str, Any] = {"num_labels": task.num_labels,
                              "problem_type": "regression" if task.is_regression else "single_label_classification"}
    if not task.is_regression:
        kwargs["id2label"] = dict(enumerate(task.label_names))
        kwargs["label2id"] = {name: i for i, name in enumerate(task.label_names)}
    return kwargs


def _dropout_kwargs(p: float | None) -> Dict[str, float]:
    # BERT-family names; architectures with other names ignore them.
    return {} if p is None else {"hidden_dropout_prob": p, "attention_probs_dropout_prob": p}


def build_model(cfg: ModelConfig, task: TaskConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """The model as transformers builds it; the fast paths (:func:`nli.fastpaths.install`) come on
    once it is on its device."""
    return _build(cfg, task, tokenizer)


def _build(cfg: ModelConfig, task: TaskConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    if cfg.attention == Attention.flash_attention_2 and importlib.util.find_spec("flash_attn") is None:
        raise ConfigError("model.attention=flash_attention_2 needs the flash-attn package (pip install flash-attn, "
                          "on a CUDA machine); model.attention=sdpa uses torch's own fused kernels")
    if cfg.scratch is not None:
        return _scratch_model(cfg.scratch, task, tokenizer, attention=cfg.attention.value)
    assert cfg.name_or_path is not None
    kwargs = {**_label_kwargs(task), **_dropout_kwargs(cfg.dropout),
              "ignore_mismatched_sizes": cfg.ignore_mismatched_sizes, "attn_implementation": cfg.attention.value}
    _check_head(pretrained_config(cfg), cfg, task)
    if _local_dir(cfg.name_or_path):
        return AutoModelForSequenceClassification.from_pretrained(cfg.name_or_path, **kwargs)
    with hub_download(f"model '{cfg.name_or_path}'"):
        return AutoModelForSequenceClassification.from_pretrained(cfg.name_or_path, revision=cfg.revision,
                                                                  **kwargs)


def _check_head(config: PretrainedConfig, cfg: ModelConfig, task: TaskConfig) -> None:
    """A checkpoint fine-tuned for another task has a head of another size; say so before
    transformers fails on the weight shapes (a base checkpoint has no head: any size goes)."""
    has_head = any(name.endswith("ForSequenceClassification") for name in config.architectures or [])
    if has_head and config.num_labels != task.num_labels and not cfg.ignore_mismatched_sizes:
        head = ", ".join(config.id2label[i] for i in sorted(config.id2label))
        raise ConfigError(f"model.name_or_path={cfg.name_or_path} has a classification head for "
                          f"{config.num_labels} label(s) ({head}) but task={task.name} has {task.num_labels}. "
                          "Set model.ignore_mismatched_sizes=true to replace the head with a new, "
                          "randomly initialised one")


def _scratch_model(arch: ScratchArchitecture, task: TaskConfig, tokenizer: PreTrainedTokenizerBase, *,
                   attention: str) -> PreTrainedModel:
    config = AutoConfig.for_model(
        arch.model_type,
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        intermediate_size=arch.intermediate_size,
        max_position_embeddings=arch.max_position_embeddings,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **_dropout_kwargs(arch.dropout),
        **_label_kwargs(task),
    )
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation=attention)
    log.info("model: %s from scratch, %.1fM parameters", arch.model_type,
             sum(p.numel() for p in model.parameters()) / 1e6)
    return model


def load_export(directory: Path) -> PreTrainedModel:
    """The model :func:`save_pretrained` wrote."""
    return AutoModelForSequenceClassification.from_pretrained(directory)


def save_pretrained(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """Model and tokenizer in one directory, as ``from_pretrained`` and ``pipeline`` load them."""
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def tokenizer_files(tokenizer: PreTrainedTokenizerBase) -> Dict[str, bytes]:
    """The files ``save_pretrained`` writes for ``tokenizer``: file name -> content."""
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return {path.name: path.read_bytes() for path in sorted(Path(folder).iterdir()) if path.is_file()}


def tokenizer_from_files(files: Mapping[str, bytes]) -> PreTrainedTokenizerBase:
    """The tokenizer :func:`tokenizer_files` saved."""
    with tempfile.TemporaryDirectory() as folder:
        for name, content in files.items():
            (Path(folder) / name).write_bytes(content)
        return AutoTokenizer.from_pretrained(folder)


def share_tokenizer(tokenizer: PreTrainedTokenizerBase, world: World) -> PreTrainedTokenizerBase:
    """Rank 0's tokenizer on every rank: one learnt from the training text must not differ by a
    token between ranks, or their examples would not mean the same thing."""
    if not world.distributed:
        return tokenizer
    return tokenizer_from_files(world.gather(tokenizer_files(tokenizer) if world.is_main else None)[0])
