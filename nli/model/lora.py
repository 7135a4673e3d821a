"""LoRA (Hu et al. 2021) through peft: low-rank adapters on a model's Linear layers, its classification
head trained in full, every other weight frozen (``model/peft=lora``).

What trains is small, and so is what a checkpoint holds of the model: the adapters and the head
(:class:`Adapters`; 7 MB for roberta-large, 22 MB with their Adam state, where its weights are
1.4 GB). A resumed run builds the frozen weights again, from ``model.name_or_path`` (or from the
seed, for a model from scratch), and checks that they are the ones its checkpoints were trained on
(:class:`FrozenWeights`).

The export, ``model/``, is the adapters merged into the weights they adapt: a plain transformers model
that loads without peft. The adapter itself, as peft saves it, goes to ``model/adapter/`` for those
who want to load it onto the base model with peft.

peft is imported on first use: it takes seconds to import, and a run without LoRA never needs it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import torch

from nli import contract
from nli.config.schema import LoraConfig
from nli.errors import CheckpointError, ConfigError
from nli.io.storage import Storage
from nli.model.build import head_modules, host_state, unwrap

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"  # in model/: the adapter as peft's save_pretrained writes it
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # in model/adapter/: what Adapters.state_dict() holds
ADAPTER_CONFIG = "adapter_config.json"  # in model/adapter/: peft's LoraConfig
# Each family's default targets: the attention's query and value projections, the W_q and W_v the LoRA
# paper adapts (its RoBERTa and DeBERTa results). Model types as transformers names them.
DEFAULT_TARGETS: Dict[str, List[str]] = {
    "bert": ["query", "value"],
    "roberta": ["query", "value"],
    "electra": ["query", "value"],
    "deberta-v2": ["query_proj", "value_proj"],  # DeBERTa-v3 too
    "distilbert": ["q_lin", "v_lin"],
    "modernbert": ["Wqkv"],  # queries, keys and values in one fused projection: all three are adapted
}


def apply(model: PreTrainedModel, cfg: LoraConfig, *, revision: Optional[str] = None) -> PeftModel:
    """``model`` with LoRA adapters on its target modules (:func:`target_modules`) and its head
    trained in full (peft's ``modules_to_save``: a trainable copy beside the frozen original); every
    other weight frozen. The adapters are put into ``model`` itself: the result wraps it. ``revision``: the base
    model's (model.revision), which the adapter's config records, so that peft loads it onto the base it trained on."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import TaskType, get_peft_model

    targets, head = target_modules(model, cfg), head_modules(model)
    config = PeftLoraConfig(task_type=TaskType.SEQ_CLS, r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                            target_modules=targets, modules_to_save=list(head),  # a copy: peft extends it
                            revision=revision)
    with warnings.catch_warnings():  # peft asks transformers by a name transformers 5 deprecates: not the user's doing
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        wrapped = get_peft_model(model, config)
    trainable, total = parameter_counts(wrapped)
    log.info("lora: r=%d, alpha=%d on %s; the head (%s) trains in full: %s of %s parameters train (%.2f%%)", cfg.r,
             cfg.alpha, ", ".join(targets), ", ".join(head), f"{trainable:,}", f"{total:,}", 100 * trainable / total)
    return wrapped


def target_modules(model: PreTrainedModel, cfg: LoraConfig) -> List[str]:
    """The Linear modules to adapt: ``model.peft.target_modules``, else the family's default, each
    checked to name at least one Linear layer outside the head (peft matches a name against the
    end of each module's path)."""
    model_type = str(model.config.model_type)
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    heads = head_modules(model)
    outside = [name for name in linear if not any(name == head or name.startswith(f"{head}.") for head in heads)]
    known = ", ".join(sorted({name.rsplit(".", 1)[-1] for name in outside}))
    names = cfg.target_modules if cfg.target_modules is not None else DEFAULT_TARGETS.get(model_type)
    if names is None:
        raise ConfigError(f"model.peft.target_modules=null takes the family's default, and there is none for "
                          f"{model_type} models (only for {', '.join(DEFAULT_TARGETS)}). Name the Linear layers to "
                          f"adapt, e.g. model.peft.target_modules=[name,other_name]; this model's are named: {known}")
    unmatched = [name for name in names if not any(path == name or path.endswith(f".{name}") for path in outside)]
    if unmatched:
        raise ConfigError(f"model.peft.target_modules={list(names)}: {', '.join(unmatched)} names no Linear layer of "
                          f"this {model_type} model outside its head (which trains in full). Its Linear layers "
                          f"are named: {known}")
    return list(names)


def parameter_counts(model: PeftModel) -> Tuple[int, int]:
    """(trainable, all) parameters, as peft counts them (the head's frozen original included in all)."""
    trainable, total = model.get_nb_trainable_parameters()
    return int(trainable), int(total)


class Adapters:
    """The model's part of a checkpoint under LoRA: what trains, the adapters and the head, in peft's
    format (the tensors of ``adapter_model.safetensors``, by the same names)."""

    def __init__(self, model: PeftModel) -> None:
        self.model = model

    def state_dict(self) -> Dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        # save_embedding_layers=False: "auto" would ask the Hub whether the vocabulary was resized.
        return get_peft_model_state_dict(self.model, save_embedding_layers=False)

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        expected = set(self.state_dict())
        if set(state) != expected:
            missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
            raise CheckpointError(f"the checkpoint's adapters do not fit this model (missing {missing[:3]}, "
                                  f"unexpected {extra[:3]}): it was written with other model.peft settings")
        set_peft_model_state_dict(self.model, state)


class FrozenWeights:
    """A fingerprint (SHA-256) of the weights LoRA leaves frozen, kept in each checkpoint: a checkpoint
    holds only the adapters and the head, so a resumed run builds the rest again and must find them
    bit for bit as they were (a Hub branch moved on, a scratch model drawn otherwise would not be)."""

    def __init__(self, model: torch.nn.Module, where: str) -> None:
        self.model, self.where = model, where
        self._digest: str | None = None  # computed once: frozen weights do not change

    def digest(self) -> str:
        if self._digest is None:
            sha = hashlib.sha256()
            for name, param in unwrap(self.model).named_parameters():
                # The head's original stays frozen beside its trainable copy (restored from the checkpoint),
                # unused: a new head drawn otherwise on resume changes nothing.
                if not param.requires_grad and ".original_module." not in name:
                    sha.update(name.encode())
                    sha.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            self._digest = sha.hexdigest()
        return self._digest

    def state_dict(self) -> Dict[str, str]:
        return {"sha256": self.digest()}

    def load_state_dict(self, state: Dict[str, str]) -> None:
        if state["sha256"] != self.digest():
            raise CheckpointError(f"the frozen weights of {self.where} differ from those this run's checkpoints "
                                  "were trained on (a checkpoint holds only the LoRA adapters and the head, so they "
                                  "are loaded again on resume). Point model.name_or_path (and model.revision) at the "
                                  "same weights, or start afresh in a new output_dir")


def merged(model: PeftModel) -> PreTrainedModel:
    """A copy of ``model`` with its adapters merged into the weights they adapt: the plain transformers
    model (its own class and config, no peft in either). A copy, so that ``model`` trains on unchanged."""
    return copy.deepcopy(model).merge_and_unload()


def save_merged(model: PeftModel, directory: Path) -> None:
    """``model`` :func:`merged`, saved as transformers saves it; the adapter itself, as peft saves it, in
    ``directory/adapter``."""
    plain = merged(model)
    plain.save_pretrained(directory, state_dict=host_state(plain))
    model.save_pretrained(str(directory / ADAPTER_DIR), save_embedding_layers=False)
    # peft keeps the target modules as a set and writes them in its order, which Python's hash seed decides: the
    # same run's export would differ from one process to the next (and so its digest in export.json).
    written = directory / ADAPTER_DIR / ADAPTER_CONFIG
    config = json.loads(written.read_text())
    if isinstance(config.get("target_modules"), list):
        written.write_text(json.dumps({**config, "target_modules": sorted(config["target_modules"])}, indent=2,
                                      sort_keys=True) + "\n")


def exported_adapters(storage: Storage) -> Dict[str, torch.Tensor]:
    """The adapters and head of the export in ``storage``'s ``model/`` (what :class:`Adapters` loads)."""
    from safetensors.torch import load

    return load(storage.read_bytes(f"{contract.MODEL_DIR}/{ADAPTER_DIR}/{ADAPTER_WEIGHTS}"))
