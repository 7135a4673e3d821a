"""Tokenizer and sequence-classification model from config: a pretrained checkpoint (Hub id or
local directory) or an architecture with random weights and a tokenizer learnt from the data."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import re
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union, cast

import torch
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

from nli import contract
from nli.config import runfolder
from nli.config.paths import local_model
from nli.config.schema import Attention, ModelConfig, ScratchArchitecture, TaskConfig
from nli.errors import ConfigError
from nli.io.hub import hub_download
from nli.io.storage import Storage
from nli.runtime.distributed import World

log = logging.getLogger(__name__)

# RoBERTa's special tokens, in RoBERTa's id order.
SPECIAL_TOKENS = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
                  "mask_token": "<mask>"}

# Model types that number positions from padding_idx + 1 (transformers' create_position_ids_from_input_ids):
# RoBERTa's padding_idx is 1, so a sequence of n tokens takes positions 2 to n + 1.
POSITIONS_AFTER_PADDING = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text",
                                     "ibert", "longformer", "luke", "mpnet", "roberta-prelayernorm", "xmod"})
# What becomes of a checkpoint's classification head: kept (None), its rows reordered to the task's
# labels (the head's row for each), or replaced by a new one (REPLACE).
REPLACE = "replace"
HeadPlan = Union[None, List[int], str]
# The names transformers gives labels nobody named: they say nothing of the order.
GENERIC_LABEL = re.compile(r"LABEL_\d+")
# The classification head of the supported families, by parameter name: with BERT's and DeBERTa's pooler,
# DistilBERT's pre_classifier, ModernBERT's head (what trains in full under LoRA, and layer decay's top).
HEAD = re.compile(r"^(?:classifier|pooler|head|pre_classifier)\.|(?:^|\.)pooler\.")
# The dtype of every weight a run holds, trains, checkpoints and exports (as the Trainer's exports are):
# master weights and optimizer states in float32; autocast computes in the run's precision (nli.runtime.device).
WEIGHTS_DTYPE = torch.float32
# What transformers' tokenizers give as model_max_length when the checkpoint sets none (int(1e30)).
UNBOUNDED_LENGTH = 10**29


def _hub_id(what: str, name_or_path: str) -> str:
    """How a failed download names ``name_or_path``, read as a Hub id; where its owner is a folder here
    (``outputs/quick`` with an ``outputs/``), the folder that is not there is named too: the path was meant."""
    owner, _, name = name_or_path.partition("/")
    folder = Path(owner).expanduser()
    if not name or not folder.is_dir():
        return f"{what} '{name_or_path}'"
    inside = sorted(each.name for each in folder.iterdir() if each.is_dir())
    held = f"{folder}/ holds {', '.join(inside[:5])}{', ...' if len(inside) > 5 else ''}" if inside else \
        f"{folder}/ holds no folder"
    return f"{what} '{name_or_path}' (as a Hub id: there is no folder {name_or_path} here, and {held})"


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
    if local_model(cfg.name_or_path):
        tokenizer = AutoTokenizer.from_pretrained(cfg.name_or_path)
    else:
        with hub_download(_hub_id("tokenizer", cfg.name_or_path)):
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
    if not local_model(cfg.name_or_path, cfg.revision):
        with hub_download(_hub_id(what, cfg.name_or_path)):
            return AutoConfig.from_pretrained(cfg.name_or_path, revision=cfg.revision)
    path = Path(cfg.name_or_path).expanduser() / "config.json"
    exported = path.parent / contract.MODEL_DIR
    if not path.is_file() and (path.parent / contract.CONFIG_FILE).is_file() and (exported / "config.json").is_file():
        # A run folder: an evaluation reads it as its model/ (trained_model), a run that trains on from it does not.
        raise ConfigError(f"model.name_or_path={cfg.name_or_path} is a run folder: the model it trained is "
                          f"{exported}. Set model.name_or_path={exported} to train on from it")
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


# The head's dropout where a family does not call it classifier_dropout (BERT, RoBERTa, ELECTRA and
# ModernBERT do): DeBERTa reads cls_dropout (absent from its config unless set), DistilBERT seq_classif_dropout.
CLASSIFIER_DROPOUT = {"deberta": "cls_dropout", "deberta-v2": "cls_dropout", "distilbert": "seq_classif_dropout"}


def build_model(cfg: ModelConfig, task: TaskConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """The model as transformers builds it; the fast paths (:func:`nli.model.fastpaths.install`) come on
    once it is on its device."""
    return _build(cfg, task, tokenizer)


@contextmanager
def _attention_supported(cfg: ModelConfig, config: PretrainedConfig) -> Iterator[None]:
    """A family without the attention asked for (DeBERTa has no SDPA in transformers) is a ConfigError
    that names the way on, not transformers' ValueError from deep in from_pretrained."""
    try:
        yield
    except ValueError as err:
        if "does not support an attention implementation" not in str(err):
            raise
        raise ConfigError(f"model.attention={cfg.attention.value}: transformers has no such attention for "
                          f"{config.model_type} models; set model.attention=eager") from None


def _configure(config: PretrainedConfig, cfg: ModelConfig, task: TaskConfig) -> None:
    """The task's labels, and model.dropout and model.classifier_dropout under this family's names, set
    on the checkpoint's config (from_pretrained would hand a name its config lacks to the model's
    constructor, which refuses it)."""
    for name, value in _label_kwargs(task).items():
        setattr(config, name, value)
    if cfg.dropout is not None:
        names = [name for name in _dropout_kwargs(cfg.dropout) if hasattr(config, name)]
        _require_counterpart(names, "dropout", config, cfg)
        for name in names:
            setattr(config, name, cfg.dropout)
    if cfg.classifier_dropout is not None:
        name = CLASSIFIER_DROPOUT.get(config.model_type, "classifier_dropout")
        _require_counterpart([name] if name in CLASSIFIER_DROPOUT.values() or hasattr(config, name) else [],
                             "classifier_dropout", config, cfg)
        setattr(config, name, cfg.classifier_dropout)


def _require_counterpart(names: List[str], key: str, config: PretrainedConfig, cfg: ModelConfig) -> None:
    if not names:
        raise ConfigError(f"model.{key} has no counterpart in the config of model.name_or_path={cfg.name_or_path} "
                          f"(a {config.model_type} model); set model.{key}=null")


def _build(cfg: ModelConfig, task: TaskConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    if cfg.attention == Attention.flash_attention_2 and importlib.util.find_spec("flash_attn") is None:
        raise ConfigError("model.attention=flash_attention_2 needs the flash-attn package (pip install flash-attn, "
                          "on a CUDA machine); model.attention=sdpa uses torch's own fused kernels")
    if cfg.scratch is not None:
        return _scratch_model(cfg.scratch, task, tokenizer, attention=cfg.attention.value,
                              classifier_dropout=cfg.classifier_dropout)
    assert cfg.name_or_path is not None
    config = pretrained_config(cfg)
    plan = _head_plan(config, cfg, task)  # from the checkpoint's own labels, before they are renamed
    _configure(config, cfg, task)
    model = _from_pretrained(cfg, config, pass_config=True, ignore_mismatched_sizes=cfg.ignore_mismatched_sizes)
    _fit_head(model, plan, cfg)
    return model


def _from_pretrained(cfg: ModelConfig, config: PretrainedConfig, *, pass_config: bool = False,
                     **kwargs: Any) -> PreTrainedModel:
    """The checkpoint's sequence classifier, its weights in float32 whatever dtype they were stored in:
    transformers 5 loads in the stored dtype when none is given (``dtype="auto"``), and a checkpoint stored
    in fp16 (microsoft/deberta-v3-large's is) would then train fp16 master weights and Adam moments, whose
    small updates round away, and crash GradScaler, which refuses fp16 gradients. The forward pass computes
    in the run's precision under autocast (nli.runtime.device). ``pass_config``: build it with ``config`` (the task's
    labels set on it), not the checkpoint's own."""
    assert cfg.name_or_path is not None
    kwargs.update(dtype=WEIGHTS_DTYPE, attn_implementation=cfg.attention.value, **({"config": config} if pass_config
                                                                                     else {}))
    with _attention_supported(cfg, config):
        if local_model(cfg.name_or_path):
            return AutoModelForSequenceClassification.from_pretrained(cfg.name_or_path, **kwargs)
        with hub_download(_hub_id("model", cfg.name_or_path)):
            return AutoModelForSequenceClassification.from_pretrained(cfg.name_or_path, revision=cfg.revision,
                                                                       **kwargs)


def _head_plan(config: PretrainedConfig, cfg: ModelConfig, task: TaskConfig) -> HeadPlan:
    """What becomes of a checkpoint's classification head (an MNLI model's). Its labels are matched to
    the task's by name, case aside: roberta-large-mnli orders them CONTRADICTION, NEUTRAL, ENTAILMENT,
    GLUE's MNLI entailment, neutral, contradiction, so its rows are reordered. Unnamed labels (LABEL_0,
    ...) are taken in the task's order, with a warning. A head of another size, or of other names, is
    refused naming both before the weights load, unless model.ignore_mismatched_sizes asks for a new
    head (transformers makes one of another size; one of the same size is REPLACEd here)."""
    has_head = any(name.endswith("ForSequenceClassification") for name in config.architectures or [])
    if not has_head:
        return None
    head = head_labels(config)
    fix = "Set model.ignore_mismatched_sizes=true to replace the head with a new, randomly initialised one"
    if config.num_labels != task.num_labels:
        if cfg.ignore_mismatched_sizes:
            return None  # transformers gives a head of the task's size
        raise ConfigError(f"model.name_or_path={cfg.name_or_path} has a classification head for "
                          f"{config.num_labels} label(s) ({', '.join(head)}) but task={task.name} has "
                          f"{task.num_labels}. {fix}")
    if task.is_regression:
        return None
    if all(GENERIC_LABEL.fullmatch(name) for name in head):
        log.warning("model.name_or_path=%s names its head's labels %s: taken to be task=%s's %s, in that order",
                    cfg.name_or_path, head, task.name, task.label_names)
        return None
    lower = [name.lower() for name in head]
    if sorted(lower) != sorted(name.lower() for name in task.label_names):
        if cfg.ignore_mismatched_sizes:  # a head of the same size: transformers would keep it
            return REPLACE
        raise ConfigError(f"model.name_or_path={cfg.name_or_path} has a classification head for the labels {head}, "
                          f"which are not task={task.name}'s {task.label_names} by name. {fix}")
    order = [lower.index(name.lower()) for name in task.label_names]
    return None if order == sorted(order) else order


def _fit_head(model: PreTrainedModel, plan: HeadPlan, cfg: ModelConfig) -> None:
    if plan == REPLACE:
        # As these families initialise a new head (transformers' own _init_weights skips loaded weights).
        std = float(getattr(model.config, "initializer_range", 0.02))
        for module in getattr(model, "classifier", model).modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
        log.info("model: the head's labels are not the task's: its classifier starts afresh "
                 "(model.ignore_mismatched_sizes=true)")
    elif isinstance(plan, list):
        _reorder_head(model, plan, cfg)


def _reorder_head(model: PreTrainedModel, order: List[int], cfg: ModelConfig) -> None:
    """The rows of the head's output layer (the last linear layer with one output per label) put in
    the task's label order: row i then scores the task's label i."""
    head = getattr(model, "classifier", model)
    layers = [module for module in head.modules()
              if isinstance(module, torch.nn.Linear) and module.out_features == len(order)]
    if not layers:
        raise ConfigError(f"model.name_or_path={cfg.name_or_path}: the output layer of its {model.config.model_type} "
                          "head was not found, so its labels cannot be put in the task's order. Set "
                          "model.ignore_mismatched_sizes=true to replace the head")
    index = torch.tensor(order)
    with torch.no_grad():
        layers[-1].weight.copy_(layers[-1].weight[index])
        if layers[-1].bias is not None:
            layers[-1].bias.copy_(layers[-1].bias[index])
    log.info("model: the head's labels matched to the task's by name (rows %s)", order)


def _scratch_model(arch: ScratchArchitecture, task: TaskConfig, tokenizer: PreTrainedTokenizerBase, *,
                   attention: str, classifier_dropout: Optional[float]) -> PreTrainedModel:
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
        **({} if classifier_dropout is None else {"classifier_dropout": classifier_dropout}),
        **_label_kwargs(task),
    )
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation=attention, dtype=WEIGHTS_DTYPE)
    log.info("model: %s from scratch, %.1fM parameters", arch.model_type,
             sum(p.numel() for p in model.parameters()) / 1e6)
    return model


def checkpointing(model: PreTrainedModel) -> Callable[..., None]:
    """``model``'s switch for activation checkpointing, taking torch.utils.checkpoint's arguments: transformers
    5.2x's ``activation_checkpointing_enable``, or ``gradient_checkpointing_enable``, its name before (5.17, on the
    GPU machines this project's check runs on) and a deprecated alias since."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        return lambda **kwargs: enable(activation_checkpointing_kwargs=kwargs)
    return lambda **kwargs: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def head_modules(model: torch.nn.Module) -> List[str]:
    """The paths of the modules that make up ``model``'s classification head, its pooler included (what
    trains in full under LoRA: nli.model.lora), in the order of their parameters."""
    found: Dict[str, None] = {}
    for name, _ in unwrap(model).named_parameters():
        if match := HEAD.search(name):
            found[name[:match.end() - 1]] = None  # up to the head's own name: classifier, bert.pooler, ...
    return list(found)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model itself: under LoRA (nli.model.lora), the one peft put its adapters into, whose
    parameters keep the family's names; any other model as it is."""
    peft = sys.modules.get("peft")  # imported by nli.model.lora only when LoRA is on: without it, no model is peft's
    if peft is not None and isinstance(model, peft.PeftModel):
        return cast(torch.nn.Module, model.get_base_model())
    return model


def load_export(directory: Path) -> PreTrainedModel:
    """The model :func:`save_pretrained` wrote, in float32 as it was written."""
    return AutoModelForSequenceClassification.from_pretrained(directory, dtype=WEIGHTS_DTYPE)


def save_pretrained(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """Model and tokenizer in one directory, as ``from_pretrained`` and ``pipeline`` load them."""
    model.save_pretrained(directory, state_dict=host_state(model))
    tokenizer.save_pretrained(directory)


def host_state(model: torch.nn.Module) -> Optional[Dict[str, torch.Tensor]]:
    """A model on XLA's weights, copied to host memory for ``save_pretrained`` (safetensors reads a
    tensor's memory, which an XLA tensor does not have); None for any other model, saved as it is."""
    if next(model.parameters()).device.type != "xla":
        return None
    return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}


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


# ------------------------------------------------------------------------- a trained model, as it is


def trained_model(cfg: ModelConfig) -> Tuple[ModelConfig, str]:
    """``cfg`` with model.name_or_path as an evaluation loads it, and where that model is, as the user
    would write it: a run folder (nli.contract: config.yaml and model/) stands for the model it exported,
    model/; one in a bucket (or its model/) stands for its model/ there (read from its local copy,
    nli.model.bucket.from_bucket); a checkpoint
    directory or a Hub id stands for itself."""
    assert cfg.name_or_path is not None
    if "://" in cfg.name_or_path:
        return _in_bucket(cfg)
    folder = Path(cfg.name_or_path).expanduser()
    if not folder.is_dir() or (folder / "config.json").is_file() or not (folder / contract.CONFIG_FILE).is_file():
        return cfg, cfg.name_or_path
    exported = folder / contract.MODEL_DIR
    if not (exported / "config.json").is_file():
        raise ConfigError(f"model.name_or_path={cfg.name_or_path} is a run folder without an exported model "
                          f"({exported} holds no config.json): the run exports its best model at its first "
                          "evaluation. Let it get there, or point at a checkpoint directory or a Hub id")
    log.info("model.name_or_path=%s is a run folder: evaluating the model it exported, %s", cfg.name_or_path, exported)
    return dataclasses.replace(cfg, name_or_path=str(exported)), str(exported)


def _in_bucket(cfg: ModelConfig) -> Tuple[ModelConfig, str]:
    """A run folder's model in a bucket, by its URL, or a model folder there: the run reads it from its local
    copy (nli.model.bucket), as transformers reads a local folder or the Hub."""
    assert cfg.name_or_path is not None
    folder = runfolder.locate(cfg.name_or_path)
    if folder is None:  # a model folder (nli.model.bucket checks it has config.json), or nothing there
        if not Storage(cfg.name_or_path, key="model.name_or_path").check_readable():  # the bucket, or the fix
            raise ConfigError(f"model.name_or_path={cfg.name_or_path} holds no files: check the path (gcloud storage "
                              "ls), or give a local folder or a Hub id")
        return cfg, cfg.name_or_path
    where = folder.describe(contract.MODEL_DIR)
    log.info("model.name_or_path=%s is a run folder: evaluating the model it exported, %s", cfg.name_or_path, where)
    return dataclasses.replace(cfg, name_or_path=where), where


def load_trained(cfg: ModelConfig) -> PreTrainedModel:
    """A trained sequence classifier as it was saved: its own head and labels (nli.evaluate.evalsets matches
    them to a set's by name). A checkpoint without a classification head is refused: transformers
    would give it a random one."""
    assert cfg.name_or_path is not None
    config = pretrained_config(cfg)
    if not any(name.endswith("ForSequenceClassification") for name in config.architectures or []):
        raise ConfigError(f"model.name_or_path={cfg.name_or_path} is not a trained sequence classifier (its "
                          f"architectures: {config.architectures}): an evaluation needs a fine-tuned model with "
                          "its classification head, such as a run folder or FacebookAI/roberta-large-mnli")
    return _from_pretrained(cfg, config)


def head_labels(config: PretrainedConfig) -> List[str]:
    """The names of a classifier's labels, in id order (transformers names unnamed ones LABEL_0, ...)."""
    return [str(config.id2label[i]) for i in sorted(config.id2label)]
