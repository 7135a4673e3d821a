"""An evaluation-only run of a run folder reads the model as its run trained it, on what it trained for.

``python train.py eval.only=true model.name_or_path=outputs/<run>`` (the run folder, a sweep's job
folder, or its ``model/``; local or ``gs://``) takes from that folder's ``config.yaml`` (nli.contract)
what decides how its model reads its examples and what they are: the task, the sequence length, how
attention is computed and, where the task is the folder's own, where its examples are and how many
are scored (:data:`TAKEN`). The model is the one it exported (``model/``: a LoRA run's adapters
merged into it), so ``model.scratch`` and ``model.peft`` are null, as a trained model is read as it is.

What the command sets wins: a key it types, a group it selects (``task=rte``, ``experiment=...``) and
what that option's file sets. The config's defaults (``task=mnli``) do not: the folder's values take
their place. A folder written by an older version gives the keys this schema knows, the rest left out
and named. The log says in one line what came from where (:func:`apply` returns that line).

Applied to the composed config before its rules are checked, by the command line's check (nli.config.command)
and by the task function (nli.cli) alike, so that both judge the same config. Light on purpose (no
torch): the command line's check runs before torch loads.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nli import contract
from nli.config.identity import ADDED, own_folder
from nli.errors import ConfigError
from nli.io.claim import live_holder
from nli.io.storage import Storage

# What an evaluation takes from the run folder's config.yaml, each key whole: the task; where its
# examples are and how many of them are scored; how long a sequence is; how the model computes.
TAKEN = ("task", "data.dir", "data.files", "data.columns", "data.max_eval_samples", "data.synthetic_eval_size",
         "data.synthetic_version", "data.max_seq_length", "model.attention", "model.fast_paths")
# Of those, what describes the folder's task's examples: taken only where the run's task is the folder's.
WITH_TASK = ("data.dir", "data.files", "data.columns", "data.max_eval_samples", "data.synthetic_eval_size",
             "data.synthetic_version")


@dataclass
class Command:
    """What the command line decides, besides the config's defaults."""

    packages: Set[str] = field(default_factory=set)  # nodes a selected group option fills whole (task=rte: task)
    keys: Set[str] = field(default_factory=set)  # dotted keys typed, or set by a selected option's file
    typed: Set[str] = field(default_factory=set)  # keys and groups as typed (model.peft.r, model/peft)

    def decides(self, key: str) -> bool:
        """Whether the command sets ``key`` whole: itself, a node above it, or the group option filling it."""
        return key in self.packages or any(key == each or key.startswith(f"{each}.") for each in self.keys)

    def under(self, key: str) -> List[str]:
        """The keys the command sets inside ``key``: they stay the command's when ``key`` is the folder's."""
        return sorted(each for each in self.keys if each.startswith(f"{key}."))


def apply(cfg: DictConfig, typed: Sequence[str], conf_dir: Path) -> Optional[str]:
    """Where ``cfg`` (the composed config of the command ``typed``, its overrides as typed) evaluates a run
    folder's model, fill it from that folder's config.yaml in place, and return the line that says what
    came from where; None where it evaluates nothing of the kind."""
    given = OmegaConf.select(cfg, "model.name_or_path")
    if not OmegaConf.select(cfg, "eval.only") or not given:
        return None
    storage = locate(str(given))
    if storage is None:
        return None
    saved, left_out = _known(read_config(storage, str(given)), cfg)
    command = decided(typed, conf_dir)
    taken = _take(cfg, saved, command)
    _check_data_found(cfg, command, storage, str(given))
    forced = _as_trained(cfg, command)
    where = storage.describe(contract.CONFIG_FILE)
    said = ", ".join(taken) if taken else "nothing: the command's config agrees with it"
    own = [f"{key}={_show(key, OmegaConf.select(cfg, key))}" for key in TAKEN if command.decides(key)]
    return (f"model.name_or_path={given} is a run folder: from {where}, {said}"
            + (f"; {', '.join(forced)} (its exported model is read as it was trained)" if forced else "")
            + (f"; the command's own: {', '.join(own)}" if own else "")
            + (f"; left out, unknown to this version: {', '.join(left_out)}" if left_out else ""))


# --------------------------------------------------------------------------------------- the folder


def locate(name_or_path: str) -> Optional[Storage]:
    """The run folder ``name_or_path`` is (one with config.yaml), or whose ``model/`` it is; None where it
    is neither (a checkpoint directory, a Hub id). A run folder without a whole model of a finished run
    is refused (:func:`_check_export`)."""
    if "://" not in name_or_path and not Path(name_or_path).expanduser().is_dir():
        return None  # a Hub id, or a path the model's loading names as missing (nli.model.build)
    if "://" in name_or_path:
        url = name_or_path.rstrip("/")
        parent, name = posixpath.split(url)
    else:
        path = Path(name_or_path).expanduser()
        url, parent, name = str(path), str(path.resolve().parent), path.resolve().name
    here = Storage(url, key="model.name_or_path")
    if name == contract.MODEL_DIR and not here.exists(contract.CONFIG_FILE) and parent and \
            Storage(parent, key="model.name_or_path").exists(contract.CONFIG_FILE):
        run = Storage(parent, key="model.name_or_path")  # its model/: the run folder's, as the folder is
        _check_export(run, name_or_path)
        return run
    if not here.exists(contract.CONFIG_FILE) or here.exists("config.json"):  # config.json: a checkpoint
        return None
    _check_export(here, name_or_path)
    return here


def _check_export(here: Storage, name_or_path: str) -> None:
    """Refuses the run folder ``here`` (given as ``name_or_path``: the folder, or its model/) where it has no model
    to score: its run still training (its model/ is the best so far), none exported, its config.json or its
    export.json lost, or its run stopped before it finished (:func:`_check_finished`)."""
    holder = live_holder(here)
    if holder is not None:  # its model/ is the best so far, replaced at each better evaluation
        raise ConfigError(f"model.name_or_path={name_or_path} is the folder of a run still in progress ({holder}): "
                          "its model/ is the best so far and changes as the run goes on. Wait for the run to end, "
                          "or evaluate a copy of its model/ (a folder of its own)")
    if not here.exists(f"{contract.MODEL_DIR}/config.json"):
        if here.list(contract.MODEL_DIR):  # exported, and its config.json lost since: not a run that never got there
            raise ConfigError(f"model.name_or_path={here.describe(contract.MODEL_DIR)} is an exported model that is "
                              f"damaged ({here.describe(contract.MODEL_DIR, 'config.json')} is missing): export it "
                              "again (run its training command again with the same output folder), or give another "
                              "model")
        evaluated = _evaluated(here)
        if evaluated is not None:
            raise ConfigError(f"model.name_or_path={name_or_path} is the folder of an evaluation-only run, which "
                              f"exports no model: it evaluated {evaluated}. Point model.name_or_path there")
        stopped = None if here.exists(contract.RESULTS_FILE) else _newest_checkpoint(here)
        raise ConfigError(f"model.name_or_path={name_or_path} is a run folder whose run never exported a model "
                          f"({here.describe(contract.MODEL_DIR)} holds no config.json): a run exports its best model "
                          "at its first evaluation"
                          + (f", and this one stopped before it, at its checkpoint {stopped}. Finish it with its "
                             f"own command, {_finishing_command(here)}" if stopped else
                             ". Run its training command again to let it get there")
                          + ", or point model.name_or_path at a checkpoint directory or a Hub id")
    if not here.exists(f"{contract.MODEL_DIR}/{contract.EXPORT_FILE}"):
        # What tells a run's export from a save_pretrained folder is the run folder around it: its export.json, the
        # record of its files, is written last, so an export without it was cut short (or a copy left it out), and
        # nothing vouches for the files it has. A model folder of no run never had one: it loads unchecked.
        raise ConfigError(f"model.name_or_path={here.describe(contract.MODEL_DIR)} is an exported model that is "
                          f"damaged ({here.describe(contract.MODEL_DIR, contract.EXPORT_FILE)} is missing: the record "
                          "of its files, which the export writes last, so it was cut short or a copy left it out): "
                          "export it again (run its training command again with the same output folder), or give "
                          "another model")
    _check_finished(here, name_or_path)


def _check_finished(here: Storage, name_or_path: str) -> None:
    """Refuses the run folder ``here`` where its run never finished (no results.json, which a run writes last): it
    was stopped (a SIGTERM, a preemption, a crash), and its model/ is the best of the steps it got to, or of an
    earlier attempt, not the run's result. Scored, its figures would pass for the run's."""
    if here.exists(contract.RESULTS_FILE):
        return
    stopped = _newest_checkpoint(here)
    step = _export_step(here)
    raise ConfigError(f"model.name_or_path={name_or_path} is the folder of a run that never finished (it has no "
                      f"{contract.RESULTS_FILE}, which a run writes last"
                      + (f"; it stopped at its checkpoint {stopped}" if stopped else "")
                      + f"): its model/ is the best{f' of step {step}' if step is not None else ''} before it "
                      "stopped, not the run's result. Nothing was changed. Finish the run with its own command, "
                      f"{_finishing_command(here)}, then evaluate it; or, to score those weights as they are, "
                      "evaluate a copy of its model/ (a folder of its own)")


def _newest_checkpoint(here: Storage) -> Optional[str]:
    """Where the run folder ``here``'s newest whole checkpoint is (its manifest written), in its checkpoints/; None
    where it has none there."""
    steps = {int(found.group(1)): name for name in here.list(contract.CHECKPOINTS_DIR)
             if (found := contract.CHECKPOINT_NAME.match(name))
             and here.exists(f"{contract.CHECKPOINTS_DIR}/{name}/{contract.CHECKPOINT_MANIFEST}")}
    return here.describe(contract.CHECKPOINTS_DIR, steps[max(steps)]) if steps else None


def _export_step(here: Storage) -> Optional[int]:
    """The step of the weights in the run folder ``here``'s model/, as its export.json says; None where it cannot."""
    try:
        step = json.loads(here.read_bytes(f"{contract.MODEL_DIR}/{contract.EXPORT_FILE}")).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def _finishing_command(here: Storage) -> str:
    """The command that takes the run of folder ``here`` on from its checkpoint to its end: the overrides it was
    started with (its overrides.yaml) and the folder itself, where they do not name it."""
    try:
        recorded = yaml.safe_load(here.read_bytes(contract.OVERRIDES_FILE))
    except (OSError, ValueError, yaml.YAMLError):
        recorded = None
    overrides = [str(each) for each in recorded] if isinstance(recorded, list) else []
    if not any(each.startswith(("output_dir=", "hydra.run.dir=")) for each in overrides):
        overrides.append(f"{'hydra.run.dir' if here.local else 'output_dir'}={here.describe()}")
    unknown = [] if isinstance(recorded, list) else ["<its overrides>"]  # its overrides.yaml lost: they are the user's
    return " ".join(["python train.py", *unknown, *(shlex.quote(each) for each in overrides)])


def check_evaluation_folder(folder: Storage, where: str) -> None:
    """Refuses ``folder`` (``where``: as the command named it) as an evaluation-only run's output folder where it
    holds a training run (:func:`training_run`): the evaluation's results.json and config.yaml would take the place
    of that run's, and the same command asked again would answer with the training run's results, or refuse it as a
    run of other settings. Said before torch loads (nli.config.command) and as the run takes the folder
    (nli.output.folder), in a sweep's job too."""
    held = training_run(folder)
    if held is not None:
        raise ConfigError(f"{where} is the folder of a training run ({held}): an evaluation-only run there would "
                          "put its results.json and config.yaml in place of that run's. Nothing was changed. Give "
                          f"the evaluation its own {own_folder()}; model.name_or_path={folder.describe()} scores "
                          "that run's model from there")


def training_run(folder: Storage) -> Optional[str]:
    """What says ``folder`` holds a training run: its exported model/, its checkpoints/, or a config.yaml (or
    results.json) of a run that trained; None where nothing does (a new folder, an evaluation-only run's)."""
    if folder.list(contract.MODEL_DIR):
        return f"its model, {folder.describe(contract.MODEL_DIR)}"
    if folder.list(contract.CHECKPOINTS_DIR):
        return f"its checkpoints, {folder.describe(contract.CHECKPOINTS_DIR)}"
    for name, trained in ((contract.CONFIG_FILE, _trains), (contract.RESULTS_FILE, _trained)):
        try:
            recorded = yaml.safe_load(folder.read_bytes(name))  # JSON is YAML
        except (OSError, ValueError, yaml.YAMLError):
            continue  # none, or not to be told from it
        if isinstance(recorded, dict) and trained(recorded):
            return f"its {name}, of a run that trained"
    return None


def _trains(config: Mapping[str, Any]) -> bool:
    """Whether a recorded config trains: eval.only false, or absent (written before there was eval.only)."""
    evaluation = config.get("eval")
    return not (isinstance(evaluation, dict) and evaluation.get("only") is True)


def _trained(results: Mapping[str, Any]) -> bool:
    return "best_step" in results or "train_steps" in results


WEIGHTS = ("*.safetensors", "*.bin")


def check_not_in_a_model(folder: Path, where: str, *, what: str = "run", way: str = "") -> None:
    """Refuses ``folder`` (``where``: as the command or the run names it) as a ``what``'s folder where it is, or is
    inside, a model folder or checkpoints (:func:`model_or_checkpoint_above`); ``way`` says what to give instead."""
    held = model_or_checkpoint_above(folder)
    if held is not None:
        kind, found = held
        place = "is" if found == folder.expanduser().absolute() else "is inside"
        raise ConfigError(f"{where} {place} {kind} {found}: the {what}'s files would be mixed into it, and taken for "
                          f"its own or removed with it. {way or f'Give the {what} a folder of its own'}")


def model_or_checkpoint_above(folder: Path) -> Optional[Tuple[str, Path]]:
    """What ``folder`` (local) is, or is inside of, that no run may write into (its kind, and where); None where
    nothing is. A model folder (config.json beside weights or an export.json: a run's model/, a save_pretrained
    folder), whose files a run's would be taken for and which an export replaces whole; a checkpoint (step-N with
    its manifest), or a run's checkpoints/, whose old steps the run removes."""
    folder = folder.expanduser().absolute()
    for each in (folder, *folder.parents):
        if not each.is_dir():
            continue
        if (each / "config.json").is_file() and ((each / contract.EXPORT_FILE).is_file()
                                                 or any(next(each.glob(kind), None) for kind in WEIGHTS)):
            return "the model folder", each
        if (each / contract.CHECKPOINT_MANIFEST).is_file():
            return "the checkpoint", each
        if each.name == contract.CHECKPOINTS_DIR and (each.parent / contract.CONFIG_FILE).is_file():
            return "the checkpoints folder", each  # a run's own; a train.checkpoint_dir may be anywhere
    return None


def _evaluated(storage: Storage) -> Optional[str]:
    """The model an evaluation-only run's folder evaluated (its results.json says), else None."""
    try:
        results = json.loads(storage.read_bytes(contract.RESULTS_FILE))
    except (OSError, ValueError):
        return None
    return str(results["evaluated_model"]) if isinstance(results, dict) and "evaluated_model" in results else None


def read_config(storage: Storage, given: str) -> Dict[str, Any]:
    """The run folder's config.yaml, as a mapping; one that cannot be read is a ConfigError naming it."""
    where = storage.describe(contract.CONFIG_FILE)
    fix = ("Restore it from the run (it is the run's resolved config), or set what it would give on the command "
           "line and point model.name_or_path at a copy of the model/ folder outside the run folder")
    try:
        content = yaml.safe_load(storage.read_bytes(contract.CONFIG_FILE))
    except OSError as err:
        raise ConfigError(f"model.name_or_path={given} is a run folder, and {where} cannot be read ({err}). "
                          f"{fix}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        mark = getattr(err, "problem_mark", None)
        problem = f"line {mark.line + 1}: {getattr(err, 'problem', err)}" if mark is not None else str(err)
        raise ConfigError(f"model.name_or_path={given} is a run folder, and {where} is not valid YAML ({problem}). "
                          f"{fix}") from None
    if not isinstance(content, dict):
        raise ConfigError(f"model.name_or_path={given} is a run folder, and {where} is not a run's config (a "
                          f"mapping of keys; it holds {type(content).__name__}). {fix}")
    return content


def _known(saved: Mapping[str, Any], cfg: DictConfig) -> Tuple[Dict[str, Any], List[str]]:
    """Of ``saved``'s :data:`TAKEN` keys, those it holds, with only the keys this schema knows (``cfg``'s
    types); and the dotted keys left out."""
    known: Dict[str, Any] = {}
    left_out: List[str] = []
    for key in TAKEN:
        value: Any = saved
        for part in key.split("."):
            value = value.get(part, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is _ABSENT and key in ADDED:
            value = ADDED[key]  # a key added since the folder was written: the value that ran as it did then
        if value is _ABSENT:
            continue
        kind = _node_type(cfg, key)
        known[key] = _schema_keys(value, kind, key, left_out) if kind is not None else value
    return known, left_out


_ABSENT = object()


def _node_type(cfg: DictConfig, key: str) -> Optional[type]:
    """The dataclass ``cfg``'s node ``key`` is typed by (task: TaskConfig); None for a value or free mapping."""
    node = OmegaConf.select(cfg, key)
    kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    return kind if kind is not None and dataclasses.is_dataclass(kind) else None


def _schema_keys(value: Any, kind: Optional[type], prefix: str, left_out: List[str]) -> Any:
    """``value`` with only the fields of dataclass ``kind`` (and of each dataclass field within it)."""
    if kind is None or not isinstance(value, dict):
        return value
    hints = typing.get_type_hints(kind)
    kept = {}
    for key, each in value.items():
        if key not in hints:
            left_out.append(f"{prefix}.{key}")
            continue
        inner = [arg for arg in typing.get_args(hints[key]) if arg is not type(None)] or [hints[key]]
        child = inner[0] if len(inner) == 1 and dataclasses.is_dataclass(inner[0]) else None
        kept[key] = _schema_keys(each, typing.cast(Optional[type], child), f"{prefix}.{key}", left_out)
    return kept


# -------------------------------------------------------------------------------- taking its values


def _take(cfg: DictConfig, saved: Mapping[str, Any], command: Command) -> List[str]:
    """Set each of ``saved``'s keys in ``cfg`` that the command leaves to its defaults; ``key=value`` for
    each that changed ``cfg``."""
    taken: List[str] = []
    task = saved.get("task", {}).get("name") if isinstance(saved.get("task"), dict) else None
    for key, value in saved.items():
        if command.decides(key):
            continue
        if key in WITH_TASK and OmegaConf.select(cfg, "task.name") != task and command.decides("task"):
            continue  # the examples of the folder's task, and the command asks for another
        kept = {each: OmegaConf.select(cfg, each) for each in command.under(key)}
        before = _plain(OmegaConf.select(cfg, key))
        _set(cfg, key, value)
        for each, typed in kept.items():
            OmegaConf.update(cfg, each, typed, merge=False)
        if _plain(OmegaConf.select(cfg, key)) != before:
            taken.append(f"{key}={_show(key, OmegaConf.select(cfg, key))}")
    return taken


def _check_data_found(cfg: DictConfig, command: Command, storage: Storage, given: str) -> None:
    """Refuses a local data path the evaluation took from the folder's config.yaml (data.dir, an eval split's
    data.files) where it is not found from this command's working directory. A run records its paths as typed, and a
    relative one is of the folder its run was started in: read from elsewhere, the data's loading would say only that
    data.dir=glue holds no RTE/, a value the command never typed, and to put GLUE's files there."""
    found = [("data.dir", OmegaConf.select(cfg, "data.dir"))]
    evaluated = OmegaConf.select(cfg, "task.eval_splits") or {}  # an evaluation reads no training file
    files = OmegaConf.select(cfg, "data.files") or {}
    found += [(f"data.files.{split}", path) for split, path in files.items() if split in evaluated]
    for key, path in found:
        if not path or command.decides(key) or "://" in str(path) or Path(str(path)).expanduser().exists():
            continue
        above = None if Path(str(path)).expanduser().is_absolute() else _started_in(storage, str(path))
        why = ("moved or deleted since, or of another machine" if Path(str(path)).expanduser().is_absolute() else
               "a relative path, of the folder its run was started in" + (f", likely {above}" if above else ""))
        where = above / str(path) if above else "<where it is now>"
        typed = f"+{key}" if key.startswith("data.files.") else key  # Hydra adds a free mapping's key with a +
        raise ConfigError(f"model.name_or_path={given} is a run folder whose {storage.describe(contract.CONFIG_FILE)} "
                          f"gives {key}={path}, which is not found from {Path.cwd()}: {why}. Nothing was read: give "
                          f"{typed}={where} (a value the command types wins over the folder's)"
                          + ("" if Path(str(path)).expanduser().is_absolute() else
                             f", or run this command from {'there' if above else 'that folder'}"))


def _started_in(storage: Storage, path: str) -> Optional[Path]:
    """The nearest folder above the local run folder ``storage`` from which the relative ``path`` is found (a run's
    default folder, outputs/<task>/<time>, is below the one it started in); None where none is."""
    if not storage.local:
        return None
    return next((above for above in Path(storage.absolute()).parents if (above / path).exists()), None)


def _set(cfg: DictConfig, key: str, value: Any) -> None:
    """``cfg.key = value``, a typed node rebuilt from its schema (its defaults for keys ``value`` lacks)."""
    kind = _node_type(cfg, key)
    try:
        if kind is not None and isinstance(value, dict):
            value = OmegaConf.merge(OmegaConf.structured(kind), value)
        OmegaConf.update(cfg, key, value, merge=False)
    except OmegaConfBaseException as err:
        raise ConfigError(f"model.name_or_path's config.yaml gives {key}={value!r}, which this version cannot "
                          f"take ({str(err).splitlines()[0]}): set {key} on the command line") from None


def _as_trained(cfg: DictConfig, command: Command) -> List[str]:
    """A trained model is read as it was exported: no architecture built from scratch, and no new
    adapters unless the command asks for them (then nli.config.schema refuses them, saying why)."""
    forced = []
    if OmegaConf.select(cfg, "model.scratch") is not None:
        OmegaConf.update(cfg, "model.scratch", None, merge=False)
        forced.append("model.scratch=null")
    asked = any(each == "model/peft" or each == "model.peft" or each.startswith("model.peft.")
                for each in command.typed)
    if OmegaConf.select(cfg, "model.peft") is not None and not asked:
        OmegaConf.update(cfg, "model.peft", None, merge=False)
        forced.append("model.peft=null")
    return forced


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True, enum_to_str=True) if isinstance(value, DictConfig) else \
        getattr(value, "value", value)


def _show(key: str, value: Any) -> str:
    if key == "task":
        return str(value.name)
    plain = _plain(value)
    return "null" if plain is None else str(plain).lower() if isinstance(plain, bool) else str(plain)


# ------------------------------------------------------------------------------ what the command sets


def decided(typed: Sequence[str], conf_dir: Path) -> Command:
    """What the overrides ``typed`` set: their keys, and for each group option they select, the node it
    fills and the keys its file (and the options it selects in turn) sets."""
    try:
        overrides = OverridesParser.create().parse_overrides(list(typed))
    except HydraException:
        overrides = []  # Hydra's parser refuses them, and says where
    groups = {path.relative_to(conf_dir).as_posix() for path in conf_dir.rglob("*") if path.is_dir()}
    command = Command()
    for override in overrides:
        key = override.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            continue
        command.typed.add(key)
        if not _chooses(override, groups):
            command.keys.add(key)
            continue
        value = override.value()
        for option in value if isinstance(value, list) else [value]:
            _option(conf_dir, key, None if option is None else str(option), command, seen=set())
    return command


def _chooses(override: Override, groups: Set[str]) -> bool:
    key = override.key_or_group
    return "/" in key or key in groups or override.package is not None


def _option(conf_dir: Path, group: str, option: Optional[str], command: Command, seen: Set[str]) -> None:
    """What selecting ``group=option`` sets: the node it fills, the keys its file sets, and in turn what
    the options its defaults list selects set."""
    path = conf_dir / group / f"{option}.yaml"
    package = group.replace("/", ".")
    if option is None or str(path) in seen or not path.is_file():
        command.packages.add(package)
        return
    seen.add(str(path))
    text = path.read_text(encoding="utf-8")
    header = [line.split("@package", 1)[1].strip() for line in text.splitlines()
              if line.startswith("#") and "@package" in line]
    package = header[0] if header else package
    package = "" if package == "_global_" else package
    if package:
        command.packages.add(package)
    content = yaml.safe_load(text) or {}
    if not isinstance(content, dict):
        return
    for entry in content.pop("defaults", None) or []:
        for inner, chosen in (entry.items() if isinstance(entry, dict) else []):
            name = str(inner).removeprefix("override").strip()
            if name.startswith("/") and "@" not in name and not name.startswith("/schema"):
                _option(conf_dir, name.lstrip("/"), None if chosen is None else str(chosen), command, seen)
    content.pop("hydra", None)
    command.keys.update(_leaves(content, package))


def _leaves(node: Mapping[str, Any], prefix: str) -> Iterator[str]:
    for key, value in node.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            yield from _leaves(value, dotted)
        else:
            yield dotted
