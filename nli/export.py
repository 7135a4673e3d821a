"""The best model, exported to ``model/`` as soon as it becomes the best and again at the end.

The export made when a checkpoint becomes the best is a second copy of its weights: should that
checkpoint be damaged later, the run still ends with them. Where both copies are lost, the best
intact evaluated checkpoint takes the place of the best, with a warning that names what was lost.
``model/export.json`` says which step and evaluation the exported weights are.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple, cast

import torch
from transformers import PreTrainedTokenizerBase

from nli import contract, lora
from nli.checkpoint import Checkpoints
from nli.errors import CheckpointError
from nli.evaluation import Evaluation
from nli.hooks import Hook
from nli.model import load_export, save_pretrained, unwrap
from nli.storage import Storage

log = logging.getLogger(__name__)


def write(storage: Storage, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, evaluation: Evaluation,
          local: Path) -> None:
    """``model/``: the weights and tokenizer as ``save_pretrained`` writes them into ``local``, and
    ``export.json``; swapped in whole where the folder is local. Under LoRA, the adapters merged into
    the weights (a plain transformers model), and the adapter itself in ``adapter/`` (nli.lora)."""
    if unwrap(model) is not model:  # peft's wrapper: LoRA
        lora.save_merged(cast(Any, model), local)
        tokenizer.save_pretrained(local)
    else:
        save_pretrained(model, tokenizer, local)
    (local / contract.EXPORT_FILE).write_text(json.dumps(asdict(evaluation), indent=1) + "\n")
    storage.upload_dir(local, contract.MODEL_DIR)


class ExportBest(Hook):
    """Exports the model each time its evaluation is the best so far, once its checkpoint is written
    (rank 0 alone writes)."""

    def __init__(self, storage: Storage, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, *,
                 main: bool) -> None:
        self.storage, self.model, self.tokenizer, self.main = storage, model, tokenizer, main
        self._pending: Optional[Evaluation] = None

    def on_evaluation(self, evaluation: Evaluation, *, improved: bool) -> None:
        self._pending = evaluation if improved else None

    def on_checkpoint(self, step: int, where: str) -> None:
        if self._pending is None or self._pending.step != step or not self.main:
            return
        with tempfile.TemporaryDirectory() as folder:
            write(self.storage, self.model, self.tokenizer, self._pending, Path(folder))
        log.info("step %d: the best so far, exported to %s", step, self.storage.describe(contract.MODEL_DIR))
        self._pending = None


def exported(storage: Storage) -> Optional[Evaluation]:
    """The evaluation of the weights in ``model/``, if an export is there whole."""
    try:
        return Evaluation(**json.loads(storage.read_bytes(f"{contract.MODEL_DIR}/{contract.EXPORT_FILE}")))
    except (OSError, ValueError, TypeError):
        return None


def fallback(checkpoints: Checkpoints, storage: Storage, lost: Evaluation, damage: str) -> Optional[Evaluation]:
    """What stands as the best when the best checkpoint, of ``lost``, is damaged: the same evaluation
    where its export holds its weights, else the best intact evaluated checkpoint (None if none is)."""
    where = checkpoints.where(f"step-{lost.step:06d}")
    saved = exported(storage)
    if saved is not None and saved.step == lost.step:
        log.warning("the best checkpoint, %s, is damaged: %s. Its weights are safe in %s (exported when it became "
                    "the best) and stay the model", where, damage, storage.describe(contract.MODEL_DIR))
        return lost
    instead = checkpoints.best_intact()
    log.warning("the best checkpoint, %s (objective %.4f), is damaged: %s, and its export is gone: its weights are "
                "lost. %s", where, lost.objective, damage,
                f"The best intact evaluated checkpoint, step {instead.step} ({instead.objective:.4f}), takes its place"
                if instead else "No intact evaluated checkpoint is left: the next evaluation will be the best")
    return instead


def exported_weights(storage: Storage) -> Dict[str, torch.Tensor]:
    """The weights of the model in ``storage``'s ``model/``, as the model's state dict."""
    with tempfile.TemporaryDirectory() as folder:
        for name in storage.list(contract.MODEL_DIR):
            (Path(folder) / name).write_bytes(storage.read_bytes(f"{contract.MODEL_DIR}/{name}"))
        return load_export(Path(folder)).state_dict()


def best_weights(checkpoints: Checkpoints, storage: Storage, best: Evaluation, *,
                 exported: Callable[[Storage], Dict[str, torch.Tensor]] = exported_weights,
                 ) -> Tuple[Evaluation, Dict[str, torch.Tensor]]:
    """The weights to export at the end and the evaluation they had: the best checkpoint's, else its
    export's (read by ``exported``: under LoRA, its adapters), else the best intact evaluated
    checkpoint's (:func:`fallback`). They are what the checkpoints hold of the model."""
    damage = checkpoints.damage(best.step)
    if damage is None:
        return best, checkpoints.load_model_weights(best.step)
    instead = fallback(checkpoints, storage, best, damage)
    if instead is None:
        raise CheckpointError(f"no intact evaluated checkpoint is left in {checkpoints.where()} (see above): "
                              "start the run afresh in a new output_dir")
    if instead.step != best.step:
        return instead, checkpoints.load_model_weights(instead.step)
    return best, exported(storage)
