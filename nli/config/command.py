"""``python train.py``'s command line, checked before Hydra starts the run.

Hydra makes the run's folder, its log and its own record before the task function sees the config,
so a command refused there has already written into the folder. What can be answered from the command
line alone is answered here, in a fraction of a second, with one line on stderr and nothing written:

- each override's key against the config it overrides (nli.config.keys): a misspelt key, with or without
  ``+``/``++``, is named with the keys meant; a key under a null node with the option that gives it keys;
- the composed config: Hydra's own composition errors (an unknown option, a value of the wrong type),
  keys no schema knows, and, for a single run, every rule of the schema (nli.config.schema), on the config an
  evaluation of a run folder fills from that folder (nli.config.runfolder), as the run will;
- a launcher (``hydra/launcher=vertex``, ``submitit_slurm``) is chosen for a sweep (``-m``): a single run
  ignores it and would train here, on this machine;
- the local folders and files the run's data is read from are there (nli.config.paths), with the loading's own
  messages: for each job of a sweep, and the data a search's trials share, too (a Slurm sweep's said as a warning:
  its nodes may have a disk this machine lacks; a Vertex AI sweep's are of its containers);
- the run's (or the sweep's) directory is given (not empty), is not a folder of the other kind (a sweep's for
  a run, a run's for a sweep), and can be made and written: for such an evaluation, the one its default names
  after the folder's task, handed to Hydra (:func:`check` returns it).

A sweep is checked here by its keys (with each group's first option), each value of a list or range
against its key's type or its group's options, and its directory; a sweep over lists (Hydra's basic
sweeper) by the schema's rules on each of its jobs, as the job would check itself. A search's jobs, drawn
as it goes, check themselves (a job that fails does so alone, nli.cli).
``--cfg`` (and Hydra's other flags that show the config) gets the same check of its keys and types, not the
schema's rules: it shows the config as composed. An argument Hydra's grammar cannot read is named with how to type
it (a path with a space, a ``~``), and ``--shell-completion`` without its subcommand what to type. Anything else
this check cannot judge (``--config-dir``, ``--info``) is Hydra's.
"""

from __future__ import annotations

import copy
import difflib
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, cast

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException, MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from nli.config import paths, runfolder
from nli.config.keys import as_typed, built, check_known, check_override_key, key_of
from nli.config.schema import Config, config_dir, register_configs
from nli.contract import CHECKPOINTS_DIR, CLAIM_FILE, CONFIG_FILE, MULTIRUN_RECORD, RESULTS_FILE
from nli.errors import ConfigError, UserError
from nli.io.storage import Storage, file_in_the_way

MULTIRUN = ("-m", "--multirun")
HYDRA_LAUNCHER = "basic"  # Hydra's own: runs a sweep's jobs here, one after another
HYDRA_SWEEPER = "basic"  # Hydra's own: runs a list of jobs, every combination of the values typed
SLURM_LAUNCHER = paths.SLURM_LAUNCHER  # hydra-submitit-launcher's: submits the jobs with sbatch, from a Slurm machine
# The keys that decide where a job's data is (nli.config.paths): a search that draws one of them checks no data here.
DATA_KEYS = ("task", "data", "eval", "train.predict", "model.name_or_path")


@dataclass(frozen=True)
class Checked:
    """What the check hands on to Hydra's main: the overrides to give besides ``argv`` (for an evaluation of a run
    folder, the run directory its default names after the folder's task, nli.config.runfolder), and for a single
    run the ``hydra.mode`` its config composed to (:func:`known_mode`)."""

    extra: List[str] = field(default_factory=list)
    composed: bool = False  # a single run's config was composed: ``mode`` is its hydra.mode
    mode: Optional[RunMode] = None


def check(argv: Sequence[str], conf_dir: Path, config_name: str, *, data: bool = True) -> Checked:
    """Stop with ``error: ...`` (exit 1) where ``argv`` cannot run as typed; else what Hydra's main is to be
    given (:class:`Checked`). Without ``data``, a single run's data paths are the run's to look for (nli.cli: a
    process of a run on several machines)."""
    _check_completion(argv)
    split = _flags(argv)
    if split is None:
        return Checked()  # Hydra's flags that change what composes (--config-dir, ...) or answer alone: Hydra's
    flags, typed = split
    groups = {path.relative_to(conf_dir).as_posix() for path in conf_dir.rglob("*") if path.is_dir()}
    try:
        with _hydra(conf_dir):
            if flags == {"-m", "--cfg"}:  # Hydra's own answer is a ValueError's traceback
                raise ConfigError("-m runs a sweep and --cfg shows a config, one or the other: to see a job's "
                                  "config, drop -m and give that job's values (python train.py --cfg "
                                  f"job{_one_job(typed)})")
            overrides = _parsed(typed)
            _check_search_keys(overrides)
            if "-m" in flags:
                _check_sweep(config_name, overrides, groups, conf_dir)
            elif flags:  # --cfg shows the config as composed: its keys and types checked, the rules are the run's
                _check_single_values(overrides)
                _say_what_a_folder_gives(_composed_run(config_name, overrides, groups), overrides, conf_dir)
            else:
                return _check_run(config_name, overrides, groups, conf_dir, data=data)
            return Checked()
    except UserError as err:
        raise SystemExit(f"error: {err}") from None
    except yaml.YAMLError as err:  # a config file edited by hand (a user's conf/local/): the file, the line
        raise SystemExit(f"error: a config file is not valid YAML: {_yaml_problem(err)}") from None


def _say_what_a_folder_gives(cfg: DictConfig, overrides: List[Override], conf_dir: Path) -> None:
    """``--cfg`` of an evaluation of a run folder shows the config as composed (the default task=mnli, data.dir=null),
    and the run takes the folder's task, data and lengths as it starts (nli.config.runfolder): said on stderr, the
    config on stdout staying one to pipe, lest the config shown pass for the one the evaluation runs with."""
    try:
        said = runfolder.apply(cfg, [_line(o) for o in overrides], conf_dir)
    except ConfigError as err:  # the run refuses the folder: the config it would compose is none
        said = f"the run would refuse it: {err}"
    if said is not None:
        print(f"note: the config shown is as composed; an evaluation of a run folder takes more from it as it starts: "
              f"{said}", file=sys.stderr)


COMPLETION = ("--shell-completion", "-sc")
COMPLETION_COMMANDS = ("install", "uninstall", "query")


def _check_completion(argv: Sequence[str]) -> None:
    """Hydra's ``--shell-completion`` without one of its subcommands ends in a ValueError's traceback: say what to
    type instead."""
    if not any(arg in COMPLETION for arg in argv):
        return
    if not any(arg.split("=", 1)[0] in COMPLETION_COMMANDS for arg in argv):
        raise SystemExit("error: --shell-completion needs one of install=SHELL, uninstall=SHELL or query=SHELL: "
                         'to complete this command in bash, eval "$(python train.py -sc install=bash)"')


def _one_job(typed: Sequence[str]) -> str:
    """``typed`` with each listed value's first, as the end of a command line: one job of its sweep (none for a
    search's range, which has no first value)."""
    parts: List[str] = []
    for override in _parsed(list(typed)):
        if override.is_sweep_override() and not override.is_discrete_sweep():
            return ""
        parts.append(_first(override))
    return f" {shlex.join(parts)}" if parts else ""


# Hydra's flags that show the composed config instead of running, with the number of values each takes.
SHOWING = {"--cfg": 1, "-c": 1, "--resolve": 0, "--package": 1, "-p": 1}


def _flags(argv: Sequence[str]) -> Optional[Tuple[set[str], List[str]]]:
    """``argv``'s flags (``-m``, or ``--cfg`` for any flag of :data:`SHOWING`) and its overrides; None where it
    has another of Hydra's flags."""
    flags: set[str] = set()
    typed: List[str] = []
    args = iter(argv)
    for arg in args:
        name = arg.split("=", 1)[0]
        if arg in MULTIRUN:
            flags.add("-m")
        elif name in SHOWING:
            flags.add("--cfg")
            for _ in range(SHOWING[name] if "=" not in arg else 0):
                next(args, None)
        elif arg.startswith("-"):
            return None
        else:
            typed.append(arg)
    return flags, typed


def _parsed(typed: List[str]) -> List[Override]:
    """The overrides, or a ConfigError naming the first argument Hydra's grammar cannot read, and how to type it:
    the shell splits a path with a space and leaves a ~ it does not expand, and Hydra's parser said neither."""
    parser = _parser()
    try:
        return parser.parse_overrides(typed)
    except HydraException:
        pass
    for before, arg in zip(["", *typed], typed):
        try:
            parser.parse_overrides([arg])
        except HydraException as err:
            raise ConfigError(_unreadable(arg, before, str(err))) from None
    raise AssertionError("each override parses alone, and together they did not")  # Hydra's grammar is per argument


def _parser() -> OverridesParser:
    """Hydra's parser of overrides, with the config's groups where Hydra is set up: a sweep over ``glob(...)`` of
    a group's options needs them to list its values."""
    hydra = GlobalHydra.instance()
    return OverridesParser.create(config_loader=hydra.config_loader() if hydra.is_initialized() else None)


def _unreadable(arg: str, before: str, said: str) -> str:
    if "=" not in arg:
        if "=" in before:
            return (f"{arg} is not an override (key=value): if it is the rest of {before} (a value with a space), "
                    f"quote the two as one: '{before} {arg}'")
        return f"{arg} is not an override (key=value): python train.py --help lists the keys"
    key, _, value = arg.partition("=")
    if value.startswith("~"):
        return (f"{arg}: Hydra does not read ~ in a value, nor expand it: write the path in full: "
                f"{key}={os.path.expanduser(value)}")
    reason = next(line for line in said.splitlines() if not line.startswith("Error parsing override"))
    grammar = next((word for word in said.split() if word.startswith("https://")), "")
    return (f"{arg}: {reason} (quote a value with spaces or special characters: {key}='{value}'; Hydra's override "
            f"grammar: {grammar})")


SEARCHED = "hydra.sweeper.params."  # the Optuna search's space, by key: optimizer.lr: interval(1e-4, 1e-2)


def _check_search_keys(overrides: List[Override]) -> None:
    """A search's space cannot be set through ``hydra.sweeper.params.<key>``: its keys hold dots, which Hydra reads
    as nesting ("Sweeping over Hydra's configuration is not supported", or the ``+`` form). The Optuna sweeper
    takes the key itself typed with a range as its space for that key, and with one value as fixed."""
    for override in overrides:
        key = override.key_or_group
        if key.startswith(SEARCHED) and key != SEARCHED.rstrip("."):
            searched, value = key[len(SEARCHED):], _line(override).split("=", 1)[1]
            raise ConfigError(f"{_line(override)} cannot be set: Hydra reads the dots of {searched} as nesting. Type "
                              f"the key itself: '{searched}={value}'; a range typed for a key is the search's space "
                              "for it, and one value takes it out of the search")


def compose(overrides: Sequence[str] = ()) -> Config:
    """The typed config ``python train.py OVERRIDES`` runs, composed from the project's config by Hydra's
    compose API, every rule checked: for a run started from Python (``nli.recipe.run``). Hydra's global
    state is used where something (a test session) already initialised it, and left as it was."""
    register_configs()
    if GlobalHydra.instance().is_initialized():
        check_overrides(overrides, config_dir(), "train")  # the command line's messages, not Hydra's exceptions
        raw = hydra_compose("train", overrides=list(overrides))
    else:
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            check_overrides(overrides, config_dir(), "train")
            raw = hydra_compose("train", overrides=list(overrides))
    # eval.only=true of a run folder (nli.config.runfolder)
    if (taken := runfolder.apply(raw, overrides, config_dir())) is not None:
        logging.getLogger(__name__).info("%s", taken)
    return cast(Config, built(raw))


def check_overrides(overrides: Sequence[str], conf_dir: Path, config_name: str) -> None:
    """What :func:`check` asks of a single run's overrides, for a config composed from Python
    (:func:`compose`): a UserError with the command line's message (a misspelt key with the key meant,
    an unknown option, a value of the wrong type), not Hydra's exceptions. The run's folder is not checked:
    a run from Python names its own."""
    parsed = _parsed(list(overrides))
    groups = {path.relative_to(conf_dir).as_posix() for path in conf_dir.rglob("*") if path.is_dir()}
    try:
        with _hydra(conf_dir):
            _checked_run(config_name, parsed, groups, conf_dir, command_line=False)
    except yaml.YAMLError as err:
        raise ConfigError(f"a config file is not valid YAML: {_yaml_problem(err)}") from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """The parser's complaint on one line: the file, the line and column, what is wrong there."""
    mark = getattr(err, "problem_mark", None)
    if mark is None:
        return " ".join(str(err).split())
    return f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}: {getattr(err, 'problem', err)}"


@contextmanager
def _hydra(conf_dir: Path) -> Iterator[None]:
    """Hydra's compose API on ``conf_dir``; where something (a test session) already set it up, as it is."""
    if GlobalHydra.instance().is_initialized():
        yield
        return
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        yield


@contextmanager
def known_mode(checked: Checked) -> Iterator[None]:
    """Hydra's main as it is, less one composition: before it runs, it composes the whole config once only to read
    ``hydra.mode`` (``Hydra.get_mode``, 0.3 to 0.6 s), then composes it again for the run. The check composed a
    single run's config with the same overrides, so its ``hydra.mode`` is given instead."""
    if not checked.composed:
        yield
        return
    from hydra._internal.hydra import Hydra  # where Hydra 1.3 asks (hydra._internal.utils._run_hydra)

    asked = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: checked.mode  # type: ignore[method-assign]
    try:
        yield
    finally:
        Hydra.get_mode = asked  # type: ignore[method-assign]


def _check_run(config_name: str, overrides: List[Override], groups: set[str], conf_dir: Path, *,
               data: bool = True) -> Checked:
    """A single run's command checked, and Hydra's run directory where Hydra's default would not be the run's: a
    local output_dir (:func:`_run_dir`), or the folder that an evaluation of a run folder names once it has taken
    that folder's task."""
    run_dir, key, from_folder, mode, output_dir = _checked_run(config_name, overrides, groups, conf_dir, data=data)
    _check_folder(key, run_dir)
    if output_dir is not None:  # an evaluation-only run's: not a training run's folder
        runfolder.check_evaluation_folder(Storage(output_dir), f"{key}={output_dir}" if output_dir == run_dir else
                                          f"output_dir={output_dir}")
    moved = (from_folder or key == "output_dir") and not _typed_run_dir(overrides)
    return Checked([f"hydra.run.dir={_quoted(run_dir)}"] if moved else [], True, mode)


def _checked_run(config_name: str, overrides: List[Override], groups: set[str], conf_dir: Path, *,
                 command_line: bool = True, data: bool = True) -> Tuple[str, str, bool, Optional[RunMode],
                                                                          Optional[str]]:
    """A single run's config checked, as the run will check it; from the ``command_line``, its launcher (which a run
    from Python never starts) and, with ``data``, its data's local paths (nli.config.paths: a config composed from
    Python may never run, and a run from Python loads its data in a second or two). Its run directory and the key
    that names it (:func:`_run_dir`), whether it evaluates a run folder (nli.config.runfolder), its hydra.mode, and
    for an evaluation-only run its output folder where it is local (output_dir, else the run directory)."""
    _check_single_values(overrides)
    cfg = _composed_run(config_name, overrides, groups)
    _check_no_op_mappings(cfg, overrides, groups)
    if command_line:
        _check_launcher(cfg, overrides)
    from_folder = runfolder.apply(cfg, [_line(o) for o in overrides], conf_dir) is not None  # as the run will (nli.cli)
    (run_dir, key), mode = _run_dir(cfg, overrides), cfg.hydra.mode  # read before the check takes the hydra node
    output_dir = str(cfg.output_dir or run_dir) if OmegaConf.select(cfg, "eval.only") else None
    chdir = bool(cfg.hydra.job.chdir)
    config = _check_config(cfg, rules=True)
    # Where Hydra changes into the run's folder, a relative path is of that folder, not made yet.
    if command_line and data and not chdir:
        paths.check(config)
    return run_dir, key, from_folder, mode, output_dir if output_dir and "://" not in output_dir else None


def _run_dir(cfg: DictConfig, overrides: List[Override]) -> Tuple[str, str]:
    """Hydra's run directory, and the key that names it: a local ``output_dir`` where one is given, so that Hydra's
    log (train.log) is with the run's other files, each attempt's after the last; Hydra's own (``hydra.run.dir``)
    where that is typed, or where Hydra changes into it (``hydra.job.chdir``: output_dir is relative to it)."""
    output_dir = cfg.output_dir
    if output_dir and "://" not in str(output_dir) and not _typed_run_dir(overrides) and not cfg.hydra.job.chdir:
        return str(output_dir), "output_dir"
    return str(cfg.hydra.run.dir), "hydra.run.dir"


def _typed_run_dir(overrides: List[Override]) -> bool:
    return any(o.key_or_group == "hydra.run.dir" for o in overrides)


def _composed_run(config_name: str, overrides: List[Override], groups: set[str]) -> DictConfig:
    """The run's config, its overrides' keys checked against the config the group choices compose.

    That config is composed only where the run's own cannot answer for the keys: Hydra composes a plain
    ``key=value`` only where ``key`` is in the config it overrides, so when every other override is plain and
    the run's config composes, each key is known (composing is about half a second: every run saves one).
    A key under a null node, a logger the run does not select, a misspelt key: Hydra refuses them with less
    to go on, and the config the choices compose names them with the keys meant."""
    lines = [_line(o) for o in overrides]
    plain = all(_chooses(o, groups) or o.type == OverrideType.CHANGE for o in overrides)
    if plain:
        try:
            return hydra_compose(config_name, overrides=lines, return_hydra_config=True)
        # Hydra's assertion: a key under a null node; OmegaConf's AttributeError: a mapping merged into one.
        except (HydraException, OmegaConfBaseException, AssertionError, AttributeError):
            pass
    _check_keys(_compose(config_name, [_line(o) for o in overrides if _chooses(o, groups)]), overrides, groups)
    return _compose(config_name, lines)


def _check_single_values(overrides: List[Override]) -> None:
    """A run takes one value per key: values to sweep (``seed=1,2``, ``range``, ``interval``) without ``-m``
    got Hydra's parser message ("Ambiguous value"), which speaks of lists and quotes, not of sweeps."""
    swept = next((o for o in overrides if o.is_sweep_override()), None)
    if swept is not None:
        typed = " ".join(_line(o) for o in overrides)
        raise ConfigError(f"{_line(swept)} gives several values, and a single run takes one: add -m to sweep them, a "
                          f"job per value (python train.py -m {typed}), or give one value")


def _check_no_op_mappings(cfg: DictConfig, overrides: List[Override], groups: set[str]) -> None:
    """``key={}`` merges nothing into the mapping at ``key`` (Hydra merges a mapping typed on the command line
    into the config's): the run would go on with every entry it meant to drop (``'task.eval_splits={}'``
    evaluated as before)."""
    for override in overrides:
        if _chooses(override, groups) or override.type != OverrideType.CHANGE or override.value() != {}:
            continue
        key = override.key_or_group
        node = OmegaConf.select(cfg, key)
        if isinstance(node, DictConfig) and len(node):
            entries = list(map(str, node))
            raise ConfigError(f"{_line(override)} changes nothing: Hydra merges a mapping given on the command line "
                              f"into the config's, and {key} keeps {', '.join(entries)}. Drop an entry with "
                              f"~{key}.{entries[0]}, or set one with {key}.{entries[0]}=...")


def _check_launcher(cfg: DictConfig, overrides: List[Override]) -> None:
    """Hydra hands a single run to no launcher: it runs here. A launcher chosen without ``-m`` (typed, or by
    an experiment) would have the run train on this machine, where its user meant a cloud's or a cluster's."""
    launcher = _launcher(cfg)
    if launcher != HYDRA_LAUNCHER:
        typed = shlex.join(_line(o) for o in overrides)
        raise ConfigError(f"hydra/launcher={launcher} launches a sweep's jobs, and without -m Hydra runs this one "
                          f"here, on this machine: add -m (python train.py -m {typed}; a sweep of one job is fine)")


def _quoted(value: str) -> str:
    """``value`` as an override's value that Hydra's parser reads back as it is."""
    if re.fullmatch(r"[\w./:+-]+", value):
        return value
    return "'" + value.replace("'", "\\'") + "'"  # in quotes, a backslash escapes a quote alone


def _check_sweep(config_name: str, overrides: List[Override], groups: set[str], conf_dir: Path) -> None:
    choices = [_first(o) for o in overrides if _chooses(o, groups)]
    try:  # an option its group lacks (hydra/sweeper/pruner=medain) named with the group's options
        base = _compose(config_name, choices)
    except (OmegaConfBaseException, AssertionError):
        return  # each job composes its own, and Hydra names what is wrong
    _check_ranges(base, overrides)
    _check_slurm(base)
    _check_keys(base, overrides, groups)
    # The sweep's own settings (its launcher's, its folder), once: a value they refuse is no job's fault.
    plain = [_line(o) for o in overrides if o.key_or_group.startswith("hydra.") and not o.is_sweep_override()]
    launched = _compose(config_name, [*choices, *plain])
    _check_slurm_gpus(launched)
    _check_values(config_name, overrides, groups, choices, base)
    data = _DataCheck.of(launched)
    _check_jobs(config_name, overrides, groups, base, conf_dir, data)
    _check_search_data(config_name, overrides, base, conf_dir, data)
    data.say()
    _check_folder("hydra.sweep.dir", str(launched.hydra.sweep.dir))


def _check_ranges(base: DictConfig, overrides: List[Override]) -> None:
    """``interval(a,b)`` is a range for a search to draw from: Hydra's basic sweeper, which runs a list of jobs,
    ended in its own traceback."""
    interval = next((o for o in overrides if o.is_interval_sweep()), None)
    if interval is not None and _sweeper(base) == HYDRA_SWEEPER:
        key = as_typed(_line(interval))
        raise ConfigError(f"{_line(interval)} is a range for a search to draw from, and this sweep runs a list of "
                          "jobs: search it with Optuna (hydra/sweeper=optuna, or a search of conf/hparams_search/: "
                          f"docs/sweeps.md), or list values ({key}=1e-5,3e-5,1e-4)")


def _check_slurm(base: DictConfig) -> None:
    """Slurm's launcher on a machine without Slurm (a workstation, a laptop): submitit looks for ``srun`` as the
    sweep starts, and its RuntimeError came as a traceback, after Hydra had made the sweep's folder."""
    launcher = _launcher(base)
    if launcher == SLURM_LAUNCHER and shutil.which("srun") is None:
        raise ConfigError(f"hydra/launcher={launcher} submits the sweep's jobs to Slurm, and this machine has none "
                          "(no srun on PATH): run the command on the cluster's login node, or try the sweep here with "
                          "hydra/launcher=submitit_local, which runs its jobs as Slurm would (docs/slurm.md)")


# submitit's keys that ask Slurm for GPUs: with none of them set, sbatch asks for none.
SLURM_GPU_KEYS = ("gpus_per_node", "gpus_per_task", "gres")


def _check_slurm_gpus(cfg: DictConfig) -> None:
    """A Slurm sweep whose ``hw`` trains on GPUs and whose launcher asks Slurm for none: each job waited in the
    queue for a machine, then stopped there, refusing a GPU preset on a machine without one."""
    gpus = OmegaConf.select(cfg, "hw.gpus_per_node", default=0) or 0
    launcher = cfg.hydra.launcher
    asked = [key for key in SLURM_GPU_KEYS if OmegaConf.select(launcher, key, default=None) is not None]
    asked += [key for key in (OmegaConf.select(launcher, "additional_parameters", default=None) or {})
              if key.startswith(("gres", "gpus"))]
    if _launcher(cfg) == SLURM_LAUNCHER and gpus and not asked:
        hw = OmegaConf.select(cfg, "hydra.runtime.choices", default={}).get("hw", "?")
        raise ConfigError(f"hw={hw} trains on {gpus} GPU(s) per machine, and the launcher asks Slurm for none "
                          f"(hydra.launcher.gpus_per_node is unset): each job would wait for a machine only to stop "
                          f"there. Add hydra.launcher.gpus_per_node={gpus} (docs/slurm.md)")


def _check_values(config_name: str, overrides: List[Override], groups: set[str], choices: List[str],
                  base: DictConfig) -> None:
    """Each value of a sweep over a list or a range, as its job will take it: an option its group lacks, or a
    value its key's type refuses (``optimizer.lr=5e-4,abc``), stops the sweep here, named, before any job
    runs. A value is set on the composed config (no composition per value: a sweep of a hundred seeds
    stays instant); an option is composed, with the other groups at their first options."""
    for override in overrides:
        if not override.is_discrete_sweep() or override.key_or_group.startswith("hydra."):
            continue
        key = as_typed(_line(override))
        for value, text in zip(override.sweep_iterator(), override.sweep_string_iterator()):
            try:
                if _chooses(override, groups):
                    _compose(config_name, [*(c for c in choices if as_typed(c) != key), f"{key}={text}"])
                else:
                    with open_dict(base):
                        OmegaConf.update(base, override.key_or_group, value, merge=True)
            except (UserError, OmegaConfBaseException) as err:
                reason = _refused_value(f"{key}={text}", err) if isinstance(err, OmegaConfBaseException) else str(err)
                raise ConfigError(f"{key}={text}, one job of the sweep {_line(override)}: {reason}") from None


@dataclass
class _DataCheck:
    """A sweep's jobs' data paths looked for here, as :func:`nli.config.paths.how_checked` says: a job whose data is
    missing refused, or said in a warning (``missing``) once its checks are done."""

    mode: str  # paths.REFUSE, WARN or SKIP
    missing: Dict[str, List[str]] = field(default_factory=dict)  # WARN: the jobs (by their swept values) by why

    @classmethod
    def of(cls, launched: DictConfig) -> _DataCheck:
        return cls(paths.how_checked(launched))

    def job(self, config: Any, which: str) -> None:
        """Check the paths of the job ``which`` (its swept values), whose config ``config`` passed the rules."""
        if self.mode == paths.SKIP:
            return
        try:
            paths.check(config)
        except UserError as err:
            if self.mode == paths.REFUSE:
                raise
            self.missing.setdefault(str(err), []).append(which)

    def say(self) -> None:
        """The paths not found here, once each, on stderr: the sweep goes on."""
        for why, jobs in self.missing.items():
            one = len(jobs) == 1 and jobs[0]
            who, start = (f"the sweep's job {jobs[0]}", "it starts") if one else ("the sweep's jobs", "they start")
            print(f"warning: {why} (on this machine; {who} will read it on the cluster's nodes, and stop as {start} "
                  "on a node without it)", file=sys.stderr)


def _check_jobs(config_name: str, overrides: List[Override], groups: set[str], base: DictConfig,
                conf_dir: Path, data: _DataCheck) -> None:
    """Every job of a sweep that runs a list (Hydra's basic sweeper) checked by the schema's rules, as the job will
    check itself: a value they refuse, alone or beside another swept value (``optimizer.lr=-1``; ``hw=v100`` with a
    global batch no multiple of its per-device batch), stops the sweep here, naming the job, before any job runs or
    waits in a Slurm queue or for a Vertex AI machine. Jobs are made as the sweeper makes them (its
    ``hydra.sweeper.params`` too); a config is composed once for each combination of group options, and each job's
    values set on a copy of it (a hundred jobs take about a second)."""
    if _sweeper(base) != HYDRA_SWEEPER:
        return  # a search draws its jobs as it goes: each checks itself as it starts
    parser = _parser()
    params = OmegaConf.select(base, "hydra.sweeper.params") or {}
    typed = [*parser.parse_overrides([f"{key}={value}" for key, value in params.items()]), *overrides]
    swept = {o.get_key_element() for o in typed if o.is_sweep_override()}
    jobs = BasicSweeper.split_arguments(typed, None)[0]  # the sweeper's own: its jobs, in its order
    composed: Dict[Tuple[str, ...], DictConfig] = {}
    refused = [(" ".join(_line(o) for o in job if o.get_key_element() in swept), why) for job in
               map(parser.parse_overrides, jobs)
               if (why := _job_refused(config_name, job, swept, groups, composed, conf_dir, data))]
    if refused:
        raise ConfigError(f"{_refusal(refused, len(jobs))}. No job has run: mend the value, or drop it from the sweep")


def _check_search_data(config_name: str, overrides: List[Override], base: DictConfig, conf_dir: Path,
                       data: _DataCheck) -> None:
    """A search's trials, drawn as it goes, check themselves as they start; the data they all read, where no key the
    search draws decides it, is checked here once: a missing folder stopped every trial, one after another."""
    if _sweeper(base) == HYDRA_SWEEPER or data.mode == paths.SKIP:
        return
    drawn = [*(o.get_key_element() for o in overrides if o.is_sweep_override()),
             *(OmegaConf.select(base, "hydra.sweeper.params") or {})]
    if any(key == each or key.startswith(f"{each}.") for key in map(str, drawn) for each in DATA_KEYS):
        return
    fixed = [_line(o) for o in overrides if not o.is_sweep_override() and not o.is_hydra_override()]
    try:
        cfg = _compose(config_name, fixed)
        runfolder.apply(cfg, fixed, conf_dir)
        config = _check_config(cfg, rules=True)
    except (UserError, OmegaConfBaseException):
        return  # a rule the fixed values break is the trials' to name, each with its drawn values
    try:
        data.job(config, "")
    except UserError as err:
        raise ConfigError(f"every trial of the search would stop as it starts: {err}. No trial has run") from None


def _job_refused(config_name: str, job: List[Override], swept: set[str], groups: set[str],
                 composed: Dict[Tuple[str, ...], DictConfig], conf_dir: Path, data: _DataCheck) -> Optional[str]:
    """Why the schema's rules refuse the sweep's ``job``, if they do: its group options and fixed values composed
    (once for every job that shares them, in ``composed``), its swept values set on a copy. An evaluation of a run
    folder is checked with the folder's config taken in, as the job will take it (nli.cli). Its data's paths are
    looked for as ``data`` says: a missing one refuses it, or is kept for the warning."""
    values = [o for o in job if o.get_key_element() in swept and not _chooses(o, groups) and not o.is_hydra_override()]
    try:
        choices = tuple(_line(o) for o in job if o not in values)
        if choices not in composed:
            composed[choices] = _composed_job(config_name, [o for o in job if o not in values], groups)
            with open_dict(composed[choices]):
                del composed[choices]["hydra"]  # read by no rule, and the better part of each copy's time
        cfg = copy.deepcopy(composed[choices])
        with open_dict(cfg):
            for value in values:
                OmegaConf.update(cfg, value.key_or_group, value.value(), merge=True)
        runfolder.apply(cfg, [_line(o) for o in job], conf_dir)
        data.job(_check_config(cfg, rules=True), " ".join(_line(o) for o in job if o.get_key_element() in swept))
    except UserError as err:
        return str(err)
    except OmegaConfBaseException as err:
        return _refused_value(" ".join(map(_line, values)), err)
    return None


def _composed_job(config_name: str, overrides: List[Override], groups: set[str]) -> DictConfig:
    """A job's config from ``overrides``; where Hydra or OmegaConf cannot apply one to this job's group options (a
    key under a node they leave null: an assertion, or a mapping merged into one: an AttributeError), the key
    named by the config those options compose, as a single run's check names it."""
    try:
        return _compose(config_name, [_line(o) for o in overrides])
    except (AssertionError, AttributeError):
        _check_keys(_compose(config_name, [_line(o) for o in overrides if _chooses(o, groups)]), overrides, groups)
        raise


def _refusal(refused: Sequence[Tuple[str, str]], jobs: int) -> str:
    """The jobs ``refused`` (each by its swept values, and why), out of the sweep's ``jobs``, in a line."""
    (which, why), count = refused[0], len(refused)
    if count == jobs and len({reason for _, reason in refused}) == 1:
        return f"every job of the sweep would stop as it starts: {why}"
    if count == 1:
        return f"the sweep's job {which} would stop as it starts: {why}"
    every = f"every one of the sweep's {jobs} jobs" if count == jobs else f"{count} of the sweep's {jobs} jobs"
    return f"{every} would stop as they start; the first, {which}: {why}"


def _sweeper(cfg: DictConfig) -> str:
    return str(OmegaConf.select(cfg, "hydra.runtime.choices", default={}).get("hydra/sweeper", HYDRA_SWEEPER))


def _launcher(cfg: DictConfig) -> str:
    return str(OmegaConf.select(cfg, "hydra.runtime.choices", default={}).get("hydra/launcher", HYDRA_LAUNCHER))


def _compose(config_name: str, overrides: List[str]) -> DictConfig:
    try:
        return hydra_compose(config_name, overrides=overrides, return_hydra_config=True)
    except MissingConfigException as err:
        raise ConfigError(_missing_option(err)) from None
    except HydraException as err:  # an unknown option, a value of the wrong type: Hydra's words, once
        merged = re.match(r"Error merging override (.+)", str(err))
        if merged and isinstance(err.__cause__, OmegaConfBaseException):
            raise ConfigError(f"{merged[1]}: {_refused_value(merged[1], err.__cause__)}") from None
        cause = f"\n{err.__cause__}" if err.__cause__ is not None else ""
        raise ConfigError(f"{err}{cause}".split("\nConfig search path:")[0].strip()) from None


def _missing_option(err: MissingConfigException) -> str:
    """Hydra's words for an option no group has, with the group's options where Hydra gave none: for an option in a
    list (``logger=[csv,tensorbord]``) it says only that it could not load it, as of a broken file."""
    words = str(err).split("\nConfig search path:")[0].strip()
    group, _, name = (err.missing_cfg_file or "").rpartition("/")
    if err.options is not None or not group:
        return words
    options = GlobalHydra.instance().config_loader().get_group_options(group)
    if not options or name in options:
        return words  # the option is there, and its file is what failed to load
    near = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    meant = f" (did you mean {near[0]}?)" if near else ""
    return f"{group} has no option {name}{meant}: its options are {', '.join(options)}"


def _refused_value(typed: str, err: OmegaConfBaseException) -> str:
    """Why the key of the override ``typed`` refuses its value, in one line: OmegaConf's own first line (the rest
    names its classes), and for a list given without brackets, the brackets."""
    reason = str(err).split("\n")[0]
    if "is not a ListConfig, list or tuple" in reason:
        key, _, value = typed.partition("=")
        return f"{key_of(typed)} takes a list, in brackets: {key}=[{value}]"
    return reason


def _check_keys(base: DictConfig, overrides: List[Override], groups: set[str]) -> None:
    for override in overrides:
        if not _chooses(override, groups) and override.type != OverrideType.DEL:
            value = None if override.is_sweep_override() else override.value()
            check_override_key(base, override.key_or_group, _line(override),
                               mapping=value if isinstance(value, dict) else None)
            _check_added(base, override, value)


def _check_added(base: DictConfig, override: Override, value: Any) -> None:
    """``+key=value`` for a key the config already sets: Hydra refuses it in three lines as it composes (a
    mapping or a list it merges instead)."""
    current = OmegaConf.select(base, override.key_or_group, throw_on_missing=False)
    if override.is_add() and current is not None and not isinstance(value, (dict, list)):
        line = _line(override)
        raise ConfigError(f"{line} adds {override.key_or_group}, which this config already sets ({current}): "
                          f"drop the + to set it ({line[1:]})")


def _check_config(cfg: DictConfig, *, rules: bool) -> Any:
    """``cfg``'s keys checked and, with ``rules``, the schema's rules: its typed config (None without)."""
    with open_dict(cfg):
        cfg.pop("hydra", None)
    if rules:
        return built(cfg)  # the schema's rules (nli.config.schema): ConfigError names the key and the fix
    check_known(cfg)
    return None


def _line(override: Override) -> str:
    """The override as typed."""
    return str(override.input_line)


def _chooses(override: Override, groups: set[str]) -> bool:
    """An override that picks a group's option (model=tiny, hydra/launcher=vertex, model@x=...); not a mapping typed
    for a group's node (optimizer={lr:1e-3}), which sets its keys."""
    key = override.key_or_group
    if key in groups and not override.is_sweep_override() and isinstance(override.value(), dict):
        return False
    return "/" in key or key in groups or override.package is not None


def _first(override: Override) -> str:
    """A sweep over a group's options, as its first option: the keys it gives are what the check needs."""
    if not override.is_sweep_override():
        return _line(override)
    key = as_typed(_line(override))
    first = next(iter(override.sweep_string_iterator()), None)
    if first is None:  # a glob that matches no option: the sweep would have no job
        options = GlobalHydra.instance().config_loader().get_group_options(override.key_or_group)
        raise ConfigError(f"{_line(override)} matches none of {override.key_or_group}'s options "
                          f"({', '.join(options)}): the sweep would have no job")
    return f"{key}={first}"


def _check_folder(key: str, folder: str) -> None:
    """The folder a run (``hydra.run.dir``) or a sweep (``hydra.sweep.dir``) writes into: given, not the other's
    kind of folder (a sweep's jobs mixed into a run's files, or a run's into a sweep's), and writable."""
    if not folder.strip():  # Hydra takes "" as the current directory, and writes the whole run there
        raise ConfigError(f"{key} is empty (an unset shell variable?): it would write into the current directory. "
                          f"Give it a folder ({key}=runs/first), or leave it out for its default")
    path = Path(folder)
    runfolder.check_not_in_a_model(path, f"{key}={folder}", what="sweep" if key == "hydra.sweep.dir" else "run")
    if key in ("hydra.run.dir", "output_dir") and (path / MULTIRUN_RECORD).exists():
        raise ConfigError(f"{key}={folder} is a sweep's folder (it holds {MULTIRUN_RECORD}): a run there would mix "
                          "its files into the sweep's. Give the run a folder of its own")
    # A run's record or what it left, or the claim of one that has yet to write its record (nli.output.folder).
    if key == "hydra.sweep.dir" and any((path / name).exists()
                                        for name in (CONFIG_FILE, RESULTS_FILE, CHECKPOINTS_DIR, CLAIM_FILE, ".hydra")):
        raise ConfigError(f"{key}={folder} is a run's folder: a sweep there would mix its jobs into that run's files. "
                          "Give the sweep a folder of its own")
    _check_writable(key, folder)


def _check_writable(key: str, folder: str) -> None:
    """Hydra makes the folder and writes its log there first; a folder it cannot make ends in two tracebacks."""
    path = Path(folder).absolute()
    if (blocker := file_in_the_way(path)) is not None:
        raise ConfigError(f"{key}={folder}: {blocker} is a file, not a folder. Set {key} to a folder")
    existing = next(parent for parent in (path, *path.parents) if parent.exists())
    try:  # a file written where Hydra will make the folder (access() says yes to root on a read-only mount);
        # not the folder itself: Hydra names it again, and a default named by the clock may differ by a second
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as err:
        raise ConfigError(f"{key}={folder}: cannot write there ({err.strerror or err}). Set {key} to a folder you "
                          f"can write (e.g. {key}=/tmp/run), or output_dir for the run's results") from None
