"""A run's identity: what it computes, so that a folder holds one run.

The identity is the resolved config, flattened to dotted keys, less the keys that cannot change what
the run computes: where it writes, how it logs and how often, how many workers load the data, and
the hardware (a run continues on other machines: the global batch, ``train.batch_size``, stays).
Evaluation frequency is left out too: it changes which steps are looked at, not the training (a run resumed at
another cadence says so: its evaluations pick the best checkpoint and are what early stopping counts).

Every checkpoint's manifest holds the identity, and results.json its digest. A run started again in
a folder whose run has another identity is refused before anything loads, each differing key listed
as ``key: old -> new``; ``train.accept_changes`` lets a run continue with new values of the keys
where continuing makes sense (:data:`CONTINUABLE`), and the log says so.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from typing import Any, Dict, Mapping, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from nli.errors import ConfigError, RunChanged

# Keys (and key prefixes) outside the identity.
EXCLUDED = ("output_dir", "train.checkpoint_dir", "logger", "hw", "train.progress_bar", "train.log_every",
            "train.eval_every", "train.eval_batch_size", "train.checkpoint_every", "train.keep_checkpoints",
            "train.resume", "train.accept_changes", "data.num_workers", "eval.save_predictions",
            "task.diagnostic")  # which unlabelled set it predicts besides the test splits: nothing it trains
# Keys added to the config since runs first recorded their identity, at the value that trains as the
# code did before them: a run from before they existed resumes where they keep that value.
ADDED: Dict[str, Any] = {"model.classifier_dropout": None, "train.label_smoothing": 0.0, "optimizer.layer_decay": None,
         "optimizer.head_lr_scale": 1.0, "train.gradient_checkpointing": False, "task.hub_revision": None,
         "task.hub_data_dir": None, "task.no_gold_label": None, "task.groups": [], "eval.extra": [],
         "eval.only": False, "eval.dir": None, "model.peft": None, "data.synthetic_version": 1}
# Of those, the keys added since results.json first recorded the identity's digest (:func:`digest`).
UNDIGESTED = ("data.synthetic_version",)
# Keys a resumed run may take new values of (train.accept_changes): how long it trains, when it gives
# up, and what it writes at the end (eval.extra: the sets it scores the best model on). The rest would
# make the checkpoint a different run's.
CONTINUABLE = ("train.epochs", "train.max_steps", "train.early_stopping.patience", "train.early_stopping.min_delta",
               "train.skip_nonfinite", "train.predict", "eval.extra", "eval.dir")


def identity(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The resolved config (plain containers, enums as their names) as dotted keys, less :data:`EXCLUDED`."""
    flat: Dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            key = prefix[:-1]
            if not any(key == x or key.startswith(f"{x}.") for x in EXCLUDED):
                flat[key] = node

    walk(config, "")
    return dict(sorted(flat.items()))


def digest(ident: Mapping[str, Any]) -> str:
    """A short fingerprint of an identity, for results.json. Keys of :data:`UNDIGESTED` at their :data:`ADDED`
    value are left out: the digest of a run that computes as before them is the one its folder recorded."""
    kept = {key: value for key, value in ident.items() if not (key in UNDIGESTED and value == ADDED[key])}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_accepted(keys: Sequence[str]) -> None:
    """``train.accept_changes`` may name only keys where continuing makes sense."""
    refused = [key for key in keys if key not in CONTINUABLE]
    # A misspelt key (train.max_step) is no setting the run refuses to change: it is one of those, typed wrong.
    meant = {key: near[0] for key in refused if (near := difflib.get_close_matches(key, CONTINUABLE, n=1, cutoff=0.8))}
    if meant:
        raise ConfigError(f"train.accept_changes={list(keys)}: "
                          + ", ".join(f"{key} is no key: did you mean {near}?" for key, near in meant.items())
                          + f" A run continues with new values of {list(CONTINUABLE)}")
    if refused:
        raise ConfigError(f"train.accept_changes={list(keys)}: a run cannot continue with new values of {refused}; "
                          f"only of {list(CONTINUABLE)}. Start a new run in another output_dir instead")


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> Dict[str, str]:
    """Each key whose value differs -> ``old -> new`` (``(none)`` where a side lacks the key). A key
    added to the config after ``old`` was written stands there at the value that behaves as before. A node one
    side holds as a value and the other as keys (``model.peft: null`` against LoRA's ``model.peft.r``, ...) is
    one change, of the node."""
    old, new = _folded(old, new), _folded(new, old)
    changed = [key for key in sorted(set(old) | set(new)) if _value(old, key) != _value(new, key)]
    return {key: f"{_show(old, key)} -> {_show(new, key)}" for key in changed}


def _folded(config: Mapping[str, Any], other: Mapping[str, Any]) -> Dict[str, Any]:
    """``config`` with its keys under each node that ``other`` (or an older run: :data:`ADDED`) holds as one value
    gathered into that node, as a mapping."""
    folded = dict(config)
    for node in dict.fromkeys([*other, *ADDED]):
        inner = {key: value for key, value in config.items() if key.startswith(f"{node}.")}
        if inner and node not in config:
            for key in inner:
                del folded[key]
            folded[node] = {key[len(node) + 1:]: value for key, value in inner.items()}
    return folded


def in_sweep() -> bool:
    """Whether this process runs a job of a sweep (``-m``, in this process or a launcher's)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def own_folder() -> str:
    """The keys that give a run a folder of its own, as this command chose its folder: a sweep's job by the sweep's
    (Hydra reads no hydra.run.dir under -m)."""
    return f"output_dir (or {'the sweep another hydra.sweep.dir' if in_sweep() else 'hydra.run.dir'})"


def refuse(where: str, what: str, changes: Mapping[str, str], held: Mapping[str, Any], *,
           checkpointed: bool) -> RunChanged:
    """The error for a folder whose run has another identity (``held``): the differences and the ways on.
    train.accept_changes is offered only where the folder has a checkpoint to continue from (``checkpointed``)."""
    continuable = all(key in CONTINUABLE for key in changes)
    accept = (f"train.accept_changes=[{','.join(changes)}] continues it with the new values" if continuable else
              f"only new values of {', '.join(CONTINUABLE)} can be continued with (train.accept_changes)")
    if not checkpointed:
        accept = ("an evaluation's folder has no checkpoint to go on from with new values" if held.get("eval.only")
                  else "it has no checkpoint to go on from with new values")
    listed = "".join(f"\n  {key}: {change}" for key, change in changes.items())
    return RunChanged(f"{where} holds {what} with other settings:{listed}\nNothing was changed. To go on with that "
                      f"run, {_its_values(changes, held)}; or give this run its own {own_folder()}, or "
                      f"delete that folder; {accept}")


def _its_values(changes: Mapping[str, str], held: Mapping[str, Any]) -> str:
    """What to type to go on with the folder's run: its values of the keys that differ, where they can be typed
    (the command that first made the folder is not it once the run went on with new values: train.accept_changes)."""
    held = _folded(held, changes)  # a node that differs as a whole (model.peft) is given, or not, as a whole
    typed = {key: None if _value(held, key) is _NONE else _typed(_value(held, key)) for key in changes}
    if len(typed) > 6 or None in typed.values():
        return "run the command it last ran with again (its overrides.yaml lists that command's overrides)"
    return "give the values it holds: " + " ".join(f"{key}={value}" for key, value in typed.items())


def _typed(value: Any) -> Optional[str]:
    """``value`` as an override's value on the command line, where it can be typed as it is."""
    if isinstance(value, list):
        items = [_typed(item) for item in value]
        return None if None in items else f"[{','.join(str(item) for item in items)}]"
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return value if isinstance(value, str) and re.fullmatch(r"[\w./:@+-]+", value) else None


_NONE = object()


def _value(config: Mapping[str, Any], key: str) -> Any:
    """``config``'s value of ``key``; for a key added since ``config`` was written, the value that ran as it did."""
    return config.get(key, ADDED.get(key, _NONE))


def _show(config: Mapping[str, Any], key: str) -> str:
    value = _value(config, key)
    return "(none)" if value is _NONE else json.dumps(value, default=str)
