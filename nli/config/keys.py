"""Every key of a run's config is one its schema knows, or the run is refused, naming the key.

OmegaConf keeps a key added with ``+`` or ``++`` in a typed node, and ``OmegaConf.to_object`` then
sets it as a plain attribute of the dataclass, where nothing reads it: ``+optimizer.lrr=1e-3`` would
train to the end at the old rate. These checks run on the composed config (``python train.py``'s
command line before Hydra starts the run, each job of a sweep, ``nli.config.command.compose``) and on each
override's key against the config it overrides. A node typed by a dataclass takes that dataclass's
fields only; a free-form mapping (a ``Dict`` field: ``data.files``, ``data.columns``,
``task.glue.columns``) takes any key, and ``logger``'s values are each a logger's own schema.

Light on purpose (no torch): the command line checks before anything loads.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from nli.errors import ConfigError

HELP = "python train.py --help describes every key"

# Nodes a group option leaves null, and how to give them keys.
NULL_NODES = {
    "model.peft": "select the adapters first: model/peft=lora",
    "model.scratch": "model.scratch describes a model built from scratch (model=tiny); a pretrained model "
                     "(model.name_or_path) has none",
    "task.glue": "task.glue describes a task's files in GLUE's layout, and this task has none: use data.files "
                 "for files of your own",
    "hydra.sweeper.params": "Hydra's basic sweeper takes it from a config file (an experiment's YAML), and the values "
                            "typed as they are (optimizer.lr=1e-3,2e-3); an Optuna search (hydra/sweeper=optuna) "
                            "takes it typed",
}


def as_typed(override: str) -> str:
    """An override's key or group as typed, before its ``=``: ``+optimizer.lr=1`` -> ``+optimizer.lr``."""
    return override.split("=", 1)[0]


def key_of(override: str) -> str:
    """An override's key or group, without Hydra's prefix or package: ``+optimizer.lr=1`` -> ``optimizer.lr``,
    ``model@x=tiny`` -> ``model``."""
    return as_typed(override).lstrip("+~").split("@", 1)[0]


def fields_of(node: Any) -> Optional[List[str]]:
    """The keys a typed node takes (its dataclass's fields); None for a free-form mapping."""
    kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if kind is None or not dataclasses.is_dataclass(kind):
        return None
    return [each.name for each in dataclasses.fields(kind)]


def unknown_keys(cfg: DictConfig) -> List[Tuple[str, List[str]]]:
    """Each key of ``cfg`` that its node's schema does not define, with the keys that node takes."""
    return list(_unknown(cfg, ""))


def _unknown(node: DictConfig, prefix: str) -> Iterator[Tuple[str, List[str]]]:
    known = fields_of(node)
    for key in map(str, node.keys()):
        if known is not None and key not in known:
            yield f"{prefix}{key}", known
            continue
        child = node._get_node(key)  # not resolved: an interpolation is not a value to check here
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            yield from _unknown(child, f"{prefix}{key}.")


def check_known(cfg: DictConfig) -> None:
    """Refuse, naming each unknown key and the keys meant, where ``cfg`` holds a key no schema defines."""
    unknown = unknown_keys(cfg)
    if unknown:
        raise ConfigError("\n".join(not_a_key(key, known, every_key(cfg)) for key, known in unknown))


def built(cfg: DictConfig) -> Any:
    """``cfg`` as its schema's objects (``OmegaConf.to_object``, which runs each node's rules), its keys checked
    first (:func:`check_known`). A key left ``???`` (Hydra's "must be given", in a file of the user's or typed)
    is named with its fix, where OmegaConf raised with its traceback."""
    check_known(cfg)
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        key = err.full_key
        raise ConfigError(f"{key} has no value (it is ??? in this config): give it one ({key}=...)") from None


def check_override_key(cfg: DictConfig, key: str, typed: str, *, mapping: Optional[Mapping[str, Any]] = None) -> None:
    """Refuse the override ``typed`` of ``key`` (dotted) where ``cfg``, the config it overrides, cannot
    take it: a key under a node this config leaves null, one its node's schema does not define, or a new key
    of a free-form mapping without a ``+``; the same of each key of the ``mapping`` it types, if it types one."""
    parts = key.split(".")
    node: Any = cfg
    for depth, part in enumerate(parts):
        path = ".".join(parts[:depth])
        if _is_null(node):
            raise ConfigError(f"{typed} sets a key of {path}, which is null in this config: {_null_hint(path)}")
        if not isinstance(node, DictConfig):
            raise ConfigError(f"{typed}: {path} is a value, not a group of keys; set {path}=... itself")
        known = fields_of(node)
        if known is None and path.startswith("hydra.") and not typed.startswith("+") and part not in node:
            # A plugin's node made from YAML (the sweeper's, its sampler's): Hydra refuses a key it lacks unless
            # added with +, which the plugin then takes (a sampler option the file leaves out).
            taken = [str(each) for each in node if not str(each).startswith("_")]  # not Hydra's _target_ and kin
            if not taken:  # a mapping of the user's own (hydra.job.env_set)
                raise ConfigError(_needs_plus(typed, part, path))
            near = difflib.get_close_matches(part, taken, n=3, cutoff=0.6)
            meant = f"did you mean {' or '.join(f'{path}.{each}' for each in near)}? " if near else ""
            raise ConfigError(f"{key} is not a key of this config: {meant}{path} takes {', '.join(taken)} "
                              f"(+{typed} adds a key the file leaves out, for a plugin that takes it: a sampler's or "
                              "pruner's option)")
        if depth == 0 and known is not None:
            known = [*known, *(["hydra"] if "hydra" in cfg else [])]  # Hydra's own config, beside the run's
        if known is not None and part not in known:
            raise ConfigError(not_a_key(".".join(parts[:depth + 1]), known, every_key(cfg)))
        if part not in node:  # a free-form mapping's new key: it takes any, but for a logger the run does not select
            if path == "logger" and depth + 1 < len(parts):
                raise ConfigError(unselected_logger(key_of(typed), part, list(map(str, node))))
            if not typed.startswith("+"):  # Hydra's own answer was three lines and OmegaConf's node description
                raise ConfigError(_needs_plus(typed, part, path))
            return
        node = node._get_node(part)
    if mapping is not None:
        _check_mapping(cfg, node, key, typed, mapping)


def _check_mapping(cfg: DictConfig, node: Any, key: str, typed: str, mapping: Mapping[str, Any]) -> None:
    """A ``mapping`` typed for ``key``, whose node in ``cfg`` is ``node``: OmegaConf's merge into a null node
    raised an AttributeError, and Hydra's of a key the node lacks gave three lines of its own, a ``+`` among them."""
    if _is_null(node):
        raise ConfigError(f"{typed} sets keys of {key}, which is null in this config: {_null_hint(key)}")
    known = fields_of(node) if isinstance(node, DictConfig) else None
    if known is not None and (unknown := [str(name) for name in mapping if name not in known]):
        raise ConfigError(not_a_key(f"{key}.{unknown[0]}", known, every_key(cfg)))
    new = [str(name) for name in mapping if isinstance(node, DictConfig) and name not in node]
    if new and not typed.startswith("+"):
        raise ConfigError(_needs_plus(typed, ", ".join(new), key))


def _needs_plus(typed: str, names: str, path: str) -> str:
    return f"{typed} adds {names} to {path}, a mapping of your own, and Hydra adds keys only with a +: +{typed}"


def _is_null(node: Any) -> bool:
    return node is None or (isinstance(node, DictConfig) and node._is_none())


def _null_hint(path: str) -> str:
    return NULL_NODES.get(path, f"select an option that gives {path} keys first")


def not_a_key(key: str, known: Sequence[str], everywhere: Sequence[str]) -> str:
    """The message for ``key``, which its node does not take: the keys meant, never a ``+`` to add it."""
    parent, _, name = key.rpartition(".")
    prefix = f"{parent}." if parent else ""
    near = [f"{prefix}{each}" for each in difflib.get_close_matches(name, known, n=3, cutoff=0.6)]
    if not near:  # the right key in another block: +train.max_seq_length means data.max_seq_length
        near = [each for each in everywhere if each.rpartition(".")[2] == name] or \
            difflib.get_close_matches(key, everywhere, n=3, cutoff=0.75)
    meant = f"did you mean {' or '.join(near)}? " if near else ""
    where = parent or "the config's top level"
    return (f"{key} is not a key of this config: {meant}{where} takes {', '.join(known)} ({HELP}; a `+` adds "
            "no key to a schema: nothing would read it)")


def every_key(cfg: DictConfig) -> List[str]:
    """Every dotted key of ``cfg`` (its leaves and its nodes), for suggestions."""
    keys: List[str] = []

    def walk(node: DictConfig, prefix: str) -> None:
        for key in map(str, node.keys()):
            keys.append(f"{prefix}{key}")
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child, f"{prefix}{key}.")

    walk(cfg, "")
    return keys


def unselected_logger(key: str, name: str, selected: Sequence[str]) -> str:
    """The message for ``key``, a setting of logger ``name`` that the run does not select (``selected``)."""
    chosen = f"logger={selected[0]}" if len(selected) == 1 else f"logger=[{','.join(selected)}]" if selected else \
        "logger=none"
    both = f"logger=[{','.join([*selected, name])}]"
    return (f"{key} sets the {name} logger, which this run does not log to ({chosen}): select it too with {both}, "
            f"or leave {key} out")
