"""The best model, exported to ``model/`` as soon as it becomes the best and again at the end.

The export made when a checkpoint becomes the best is a second copy of its weights: should that
checkpoint be damaged later, the run still ends with them. Where both copies are lost, the best
intact evaluated checkpoint takes the place of the best, with a warning that names what was lost.
``model/export.json`` says which step and evaluation the exported weights are, and the size and
SHA-256 of every file of the export, the model card (``README.md``, nli.output.modelcard) included: the card
states the model's metrics as the Hub will show them, so a card changed after the export no longer
vouches for them, and is written again with the model. A finished run started again checks its ``model/`` against it
(:func:`check_finished`): a model that is missing or damaged is exported again from the best
checkpoint. An export.json written before it recorded the files has nothing to check them against:
such a model is taken as it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, cast

import torch
from transformers import PreTrainedTokenizerBase

from nli import contract
from nli.config.schema import ModelConfig, TaskConfig
from nli.errors import CheckpointError
from nli.evaluate.evaluation import Evaluation
from nli.io.storage import Storage
from nli.model import integrity, lora
from nli.model.build import build_model, load_export, save_pretrained, tokenizer_from_files, unwrap
from nli.output.folder import Outputs
from nli.output.modelcard import CARD_FILE, Card
from nli.train.checkpoint import Checkpoints, Snapshot, checkpoint_name, seed_everything
from nli.train.hooks import Hook

log = logging.getLogger(__name__)


def write(storage: Storage, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, evaluation: Evaluation,
          card: Optional[Card] = None) -> None:
    """``model/`` (:func:`fill`), written straight into the folder's staging copy and swapped in whole where
    the folder is local (nli.io.storage.Storage.staged_dir)."""
    with storage.staged_dir(contract.MODEL_DIR, record=contract.EXPORT_FILE) as folder:
        fill(folder, model, tokenizer, evaluation, card)


def fill(folder: Path, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, evaluation: Evaluation,
         card: Optional[Card] = None) -> None:
    """``model/``'s files in ``folder``: the weights and tokenizer (:func:`save_weights`), then what says what they
    are (:func:`describe`)."""
    save_weights(folder, model, tokenizer)
    describe(folder, evaluation, card)


def save_weights(folder: Path, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
    """The weights and tokenizer as ``save_pretrained`` writes them; under LoRA, the adapters merged into the
    weights (a plain transformers model), and the adapter itself in ``adapter/`` (nli.model.lora)."""
    with _io_errors():
        if unwrap(model) is not model:  # peft's wrapper: LoRA
            lora.save_merged(cast(Any, model), folder)
            tokenizer.save_pretrained(folder)
        else:
            save_pretrained(model, tokenizer, folder)


def describe(folder: Path, evaluation: Evaluation, card: Optional[Card] = None) -> None:
    """The model card (``README.md``, nli.output.modelcard) where ``card`` is given, and ``export.json``: the
    weights' ``evaluation`` and the digests of every file of ``folder``, written last."""
    if card is not None:  # before the digests: export.json vouches for the card as for the weights
        (folder / CARD_FILE).write_text(card.render(evaluation, adapter=_adapter_config(folder)))
    record = {**asdict(evaluation), "files": integrity.digests(folder)}
    (folder / contract.EXPORT_FILE).write_text(json.dumps(record, indent=1) + "\n")


def _adapter_config(folder: Path) -> Optional[Dict[str, Any]]:
    """The config of the LoRA adapter saved in ``folder`` (nli.model.lora.save_merged), for the card; None
    without LoRA."""
    written = folder / lora.ADAPTER_DIR / lora.ADAPTER_CONFIG
    return json.loads(written.read_text()) if written.exists() else None


_RUST_IO_ERROR = re.compile(r"\(os error (\d+)\)$")


@contextlib.contextmanager
def _io_errors() -> Iterator[None]:
    """safetensors and tokenizers write in Rust and report a write that failed as their own exception, its
    message ending in the system's error number ("No space left on device (os error 28)"): raised again as
    the OSError it was, so that the folder says what it means (a full disk: make room, run the same command)."""
    try:
        yield
    except OSError:
        raise
    except Exception as err:
        found = _RUST_IO_ERROR.search(str(err))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code)) from err


class ExportBest(Hook):
    """Exports the model each time its evaluation is the best so far, once its checkpoint is written
    (rank 0 alone writes)."""

    def __init__(self, storage: Storage, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, *,
                 main: bool, card: Optional[Card] = None) -> None:
        self.storage, self.model, self.tokenizer, self.main, self.card = storage, model, tokenizer, main, card
        self._pending: Optional[Evaluation] = None
        self.exported: Optional[Evaluation] = None  # the evaluation whose weights this process last exported

    def on_evaluation(self, evaluation: Evaluation, *, improved: bool) -> None:
        self._pending = evaluation if improved else None

    def on_checkpoint(self, step: int, where: str) -> None:
        if self._pending is None or self._pending.step != step:
            return
        if self.main:
            write(self.storage, self.model, self.tokenizer, self._pending, self.card)
            log.info("step %d: the best so far, exported to %s", step, self.storage.describe(contract.MODEL_DIR))
        self.exported, self._pending = self._pending, None  # every rank: they agree on what finish_export skips


def exported(storage: Storage) -> Optional[Evaluation]:
    """The evaluation of the weights in ``model/``, if an export is there whole."""
    try:
        record = json.loads(storage.read_bytes(f"{contract.MODEL_DIR}/{contract.EXPORT_FILE}"))
        return Evaluation(step=record["step"], metrics=record["metrics"], objective=record["objective"])
    except (OSError, ValueError, TypeError, KeyError):
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


def resume_point(checkpoints: Checkpoints, storage: Storage) -> Optional[Snapshot]:
    """The newest intact checkpoint, with the best checkpoint it names verified now, not at the end:
    where that one is damaged, the best intact evaluated checkpoint (or the export written when it
    became best, which holds its weights) takes its place (:func:`fallback`)."""
    snapshot = checkpoints.latest()
    best = snapshot.state["best"]["evaluation"] if snapshot else None
    if snapshot is None or best is None:
        return snapshot
    damage = checkpoints.damage(best["step"])
    if damage is not None:
        instead = fallback(checkpoints, storage, Evaluation(**best), damage)
        snapshot.state["best"] = {**snapshot.state["best"], "evaluation": asdict(instead) if instead else None}
    return snapshot


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


# ------------------------------------------------------------------------- a finished run's model


def check_finished(results: Mapping[str, Any], model_cfg: ModelConfig, task: TaskConfig, out: Outputs, *,
                   seed: int, card: Optional[Card] = None) -> None:
    """A finished run's ``model/``, checked against its export.json (rank 0 reads it; a training run's
    results name its ``best_step``, an evaluation-only run exports nothing). Where the model is missing
    or damaged, it is exported again from the best checkpoint, with a warning that names what was
    wrong (with ``card``, the run's model card, as it was: nli.output.modelcard); where that checkpoint is gone
    too, a CheckpointError that says so, and nothing is touched."""
    step = results.get("best_step")
    # No rank reports the run before its model is whole again; where rank 0 cannot make it whole (its checkpoint is
    # gone too), every rank stops with it, not waiting for it at the next collective until the timeout.
    with out.world.together():
        if step is not None and out.world.is_main:
            problems = integrity.damage(out.storage, int(step))
            if problems:
                _export_again(problems, results, model_cfg, task, out, seed=seed, card=card)


def _export_again(problems: List[str], results: Mapping[str, Any], model_cfg: ModelConfig, task: TaskConfig,
                  out: Outputs, *, seed: int, card: Optional[Card]) -> None:
    """``model/`` written again from the best checkpoint, with the final evaluation results.json records."""
    storage, checkpoints, claim, step = out.storage, out.checkpoints, out.claim, int(results["best_step"])
    what = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    where = checkpoints.where(checkpoint_name(step))
    lost = _lost(checkpoints, step)
    if lost is not None:
        raise CheckpointError(f"this run finished, but its model is missing or damaged ({what}), and the best "
                              f"checkpoint it was exported from, {where}, {lost}: the model cannot be made again. "
                              f"Nothing was changed. Train again in another output_dir, or delete "
                              f"{storage.describe()} and train there afresh")
    log.warning("this run finished, but its model is missing or damaged: %s. Exporting it again from the best "
                "checkpoint, %s", what, where)
    model, tokenizer = _rebuilt(model_cfg, task, seed=seed, snapshot=checkpoints.snapshot(step))
    # The best checkpoint was evaluated (that made it the best): its manifest records the evaluation's metrics, and
    # results.json their figures for the exported weights (under LoRA the merged ones': docs/lora.md), as the card had.
    evaluation = checkpoints.evaluation(step) or Evaluation(step=step, metrics={}, objective=float("nan"))
    evaluation = Evaluation(step=step, objective=results.get("objective", evaluation.objective),
                            metrics={name: results.get(name, value) for name, value in evaluation.metrics.items()})
    if claim is not None:
        claim.check()
    write(storage, model, tokenizer, evaluation, card)
    log.info("step %d, the best, exported again to %s", step, storage.describe(contract.MODEL_DIR))


def _lost(checkpoints: Checkpoints, step: int) -> Optional[str]:
    """What became of the checkpoint of ``step``, where it is gone or damaged; None where it is intact."""
    if not checkpoints.storage.exists(checkpoint_name(step)):
        return "is gone"
    broken = checkpoints.damage(step)
    return f"is damaged too ({broken})" if broken is not None else None


def _rebuilt(model_cfg: ModelConfig, task: TaskConfig, *, seed: int,
             snapshot: Snapshot) -> Tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The model a checkpoint holds, built again as the run built it, and its tokenizer. Under LoRA the
    checkpoint holds the adapters and the head: the frozen weights are built again, and checked to be the
    ones it trained on."""
    tokenizer = tokenizer_from_files(snapshot.tokenizer_files)
    seed_everything(seed)  # a model from scratch under LoRA: its frozen weights drawn as the run drew them
    model: torch.nn.Module = build_model(model_cfg, task, tokenizer)
    if model_cfg.peft is None:
        model.load_state_dict(snapshot.state["model"])
        return model, tokenizer
    model = lora.apply(cast(Any, model), model_cfg.peft, revision=model_cfg.revision)
    lora.FrozenWeights(model, frozen_source(model_cfg)).load_state_dict(snapshot.state["frozen"])
    lora.Adapters(cast(Any, model)).load_state_dict(snapshot.state["model"])
    return model, tokenizer


def frozen_source(model_cfg: ModelConfig) -> str:
    """Where LoRA's frozen weights come from, for the message that says they changed."""
    if model_cfg.pretrained:
        return f"model.name_or_path={model_cfg.name_or_path}"
    return "the model from scratch (model.scratch and seed)"
