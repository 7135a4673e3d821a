"""The project's Optuna search (``hydra/sweeper=optuna``, and the searches of conf/hparams_search/), on
current Optuna.

A search's space is Hydra's sweep syntax, by key: ``hydra.sweeper.params`` (the search's own) and the
command line's keys, which replace the search's range for a key (a range) or take the key out of the
search (one value). ``choice(a, b)`` is a categorical; ``interval(a, b)`` a float (Hydra reads its ends
as floats), ``tag(log, interval(a, b))`` on a log scale; ``range(a, b, step)`` the values Hydra's basic
sweeper would run, ``a, a+step, ...`` short of ``b`` (ints where all are).

The study is ``hydra.sweeper.storage`` (SQLite: ``sqlite:///<sweep dir>/optuna.db``; on a filesystem several
machines share, ``journal:<file>``), so the same command again continues it, its sampler seeing every earlier
trial: ``hydra.sweeper.n_trials`` is the trials each command runs (a continued study gains as many), and a
trial an earlier command left unfinished runs again first, resuming its folder. One command at a time
works on a study (a second would take the first's running trials for stopped ones): a study kept in a file is
claimed while a search runs (:func:`claim_study`). Each row of the sweep's table names its study (``study``:
:func:`study_key`), so that the table printed at a command's end, and the report, are of every command's trials of
it (nli.sweep.table.of_study).

Trials run through the configured launcher, up to ``n_jobs`` at once and the next as soon as one ends
(nli.sweep.slots); ``hydra/sweeper/pruner`` stops those the study gives up while they train
(nli.sweep.pruning). A trial whose job failed (a diverged learning rate) is FAIL in the study, and the search
goes on while the failed share of its ``n_trials`` stays within ``max_failure_rate``; so is a trial whose run
ended with a NaN objective (COMPLETED in the sweep's table: it trained to its end), which the study cannot rank.
``optimization_results.yaml`` in the sweep directory holds the best trial so far, written as each trial ends (a
search stopped by Ctrl-C, SIGTERM or its failure rate keeps it); past ``max_failure_rate``, the first failure's
error ends the search.

Light on purpose (no torch): the sweep's own process runs it, before any job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import math
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union, cast

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, RangeSweep, Transformer
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.errors import CompactHydraException, ConfigCompositionException, InstantiationException
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.exceptions import StorageInternalError
from optuna.storages.journal import JournalFileBackend
from optuna.study import StudyDirection
from optuna.trial import TrialState
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError

from nli.config.identity import EXCLUDED
from nli.config.paths import trial_refusal
from nli.config.schema import job_refusal
from nli.contract import MULTIRUN_RECORD
from nli.errors import ConfigError, StorageError
from nli.io.claim import Claim, ClaimedError, Use
from nli.io.storage import Storage
from nli.sweep import table
from nli.sweep.pruning import Watch, ended_pruned, run_folder
from nli.sweep.slots import Launched, Slots

log = logging.getLogger(__name__)

RESULTS_FILE = "optimization_results.yaml"
JOURNAL = "journal:"  # hydra.sweeper.storage=journal:<file>: Optuna's journal file storage
Space = Dict[str, BaseDistribution]
T = TypeVar("T")


# ------------------------------------------------------------------------------------ the space


def distribution(override: Override) -> Optional[BaseDistribution]:
    """The distribution a sweep override draws from; None for a plain value (the key is left out of the search)."""
    if not override.is_sweep_override():
        return None
    value = override.value()
    if override.is_choice_sweep() or (isinstance(value, RangeSweep) and value.shuffle):
        choices: List[Any] = list(override.sweep_iterator(transformer=Transformer.encode))
        return CategoricalDistribution(choices)
    if isinstance(value, RangeSweep):
        values: List[Any] = list(override.sweep_iterator(transformer=Transformer.identity))
        if not values:
            raise ConfigError(f"{override.input_line}: the range holds no value")
        if all(isinstance(each, int) for each in values):
            return IntDistribution(values[0], values[-1], step=int(value.step))
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(value.step))
    if isinstance(value, IntervalSweep):
        low, high = cast(float, value.start), cast(float, value.end)
        return FloatDistribution(float(low), float(high), log="log" in value.tags)
    raise ConfigError(f"{override.input_line}: a search draws from choice(), range() or interval(), not this")


def search_space(arguments: Sequence[str]) -> Tuple[Space, Dict[str, str]]:
    """The space searched, by key, and the keys given one value; a later argument for a key wins (the command
    line's over the search's own ``params``)."""
    space: Space = {}
    fixed: Dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(arguments)):
        key = override.get_key_element()
        space.pop(key, None)
        fixed.pop(key, None)
        drawn = distribution(override)
        if drawn is None:
            fixed[key] = override.get_value_element_as_str()
        else:
            space[key] = drawn
    return space, fixed


def grid(space: Space) -> Dict[str, List[Any]]:
    """The values the grid sampler tries for each key: a categorical's choices, a stepped range's values."""
    values: Dict[str, List[Any]] = {}
    for key, drawn in space.items():
        if isinstance(drawn, CategoricalDistribution):
            values[key] = list(drawn.choices)
        elif isinstance(drawn, (IntDistribution, FloatDistribution)) and drawn.step is not None and not drawn.log:
            count = int(round((drawn.high - drawn.low) / drawn.step)) + 1
            values[key] = [drawn.low + i * drawn.step for i in range(count)]
        else:
            raise ConfigError(f"hydra.sweeper.sampler=grid tries listed values: {key} is drawn from {drawn}; give it "
                              f"as choice(...) or range(...)")
    return values


# ---------------------------------------------------------------------------------- the sweeper


def made(node: Any, key: str) -> Any:
    """The sampler or pruner (``key``) its config describes; an option it does not take refused by name, with the
    way to leave it out (a search's config sets ``n_startup_trials`` for TPE, which the random sampler lacks)."""
    if node is None:
        return None
    target = OmegaConf.select(node, "_target_", default="?")
    try:
        return instantiate(node)
    except InstantiationException as error:
        cause = error.__cause__ or error
        option = re.search(r"unexpected keyword argument '(\w+)'", str(cause))
        if option:
            raise ConfigError(f"hydra.sweeper.{key}.{option[1]}: {target} takes no {option[1]}; leave it out with "
                              f"'~hydra.sweeper.{key}.{option[1]}'") from None
        raise ConfigError(f"hydra.sweeper.{key} ({target}): {cause}") from None


# Why a run that trained to its end can have no objective: the study cannot rank a NaN.
UNDEFINED = ("its metric is undefined on its eval set: Pearson's or Spearman's r where the gold scores or the "
             "predictions are all equal")


def _undefined(value: Any) -> bool:
    """A job's return that is a number but NaN: a run that ended, whose objective is undefined."""
    return isinstance(value, float) and math.isnan(value)


def _raise(job: Launched, max_failure_rate: float) -> None:
    """The failed trial's error, which ends the search (as Hydra's sweepers raise a failed job's). One whose message
    says all (a job's error the user can fix, a trial refused) ends it in that line and status 1, as a command's
    refusal ends: raised, Hydra would print it under 'Error executing job with overrides' and its HYDRA_FULL_ERROR
    hint, before the table; a crash is raised as it is, under its traceback."""
    result = job.result
    failed = job.error if job.error is not None or result is None or result.status == JobStatus.COMPLETED else \
        result._return_value
    if isinstance(failed, CompactHydraException):
        raise SystemExit(str(failed)) from None
    if job.error is not None:
        raise job.error
    assert result is not None
    value = result.return_value  # raises the job's error where it failed
    too_many = f"more trials failed than hydra.sweeper.max_failure_rate={max_failure_rate} allows"
    if _undefined(value):  # the job ended as it should: one line, as a job's refusal is
        raise SystemExit(f"error: trial {job.trial.number} (job {job.num}) ended with objective nan, which the study "
                         f"cannot rank ({UNDEFINED}), and counts as failed: {too_many}; raise it for the search to go "
                         "on past such trials")
    raise RuntimeError(f"trial {job.trial.number} (job {job.num}) returned {value!r}, not a number: {too_many}")


class TrialRefused(CompactHydraException):
    """A trial its config's rules refuse (nli.config.schema.job_refusal), failed without a launch; its message says
    all there is."""


class StudyLocked(ConfigError):
    """Another process held the study's SQLite file locked past :data:`LOCK_TRIES` tries."""


LOCKED = ("another process holds the study's database locked (a second command on the study, or a program "
          "reading optuna.db)")
LOCK_TRIES = 3  # SQLite waits 5 s for a lock before it gives up: a lock held for ~15 s is waited out


def _locked(error: BaseException) -> bool:
    """A lock another process holds on the study's SQLite file; Optuna wraps it where a write fails."""
    cause = error.__cause__ if isinstance(error, StorageInternalError) else error
    return isinstance(cause, OperationalError) and "database is locked" in str(cause)


def _patient(call: Callable[[], T], what: str) -> T:
    """``call()``, tried again while another process holds the study locked: a brief lock (a reader of the study)
    is waited out; one held on is :class:`StudyLocked`, saying ``what`` could not be done."""
    for attempt in range(1, LOCK_TRIES + 1):
        try:
            return call()
        except (SQLAlchemyError, StorageInternalError) as error:
            if not _locked(error):
                raise
            log.warning("%s, %s: try %d of %d", what, LOCKED, attempt, LOCK_TRIES)
    raise StudyLocked(f"{LOCKED}, and {what} failed after {LOCK_TRIES} tries: wait for that process to end, then "
                      "run the same command again")


def _told(study: optuna.Study, trial: Union[optuna.Trial, int], value: Optional[float] = None, *,
          state: Optional[TrialState] = None) -> None:
    """``study.tell``, with the grid sampler's end taken as it means it. Once a trial of the grid's last untried
    point is told, the sampler calls ``study.stop()``, which Optuna refuses outside its own optimize loop with a
    RuntimeError (documented for ask-and-tell, as this sweeper runs): raised after the trial is stored. The search
    needs no stop: it runs at most the grid's points (:meth:`OptunaSearch._sampler`). A lock on the study is waited
    out (:func:`_patient`); one held on leaves the trial RUNNING, for the next command to run again first, its
    folder answering with its finished run."""
    number = trial if isinstance(trial, int) else trial.number
    try:
        _patient(lambda: study.tell(trial, value, state=state),
                 f"storing how trial {number} ended ({state.name if state else value})")
    except RuntimeError as err:
        if not isinstance(study.sampler, optuna.samplers.GridSampler) or "Study.stop" not in str(err):
            raise


def _resume_stopped(study: optuna.Study) -> None:
    """Trials an earlier command left RUNNING (stopped by Ctrl-C or SIGTERM, their checkpoints kept) are run again
    first, with the same values and job number: their folders, named by the number, resume where they stopped. The
    stopped trial is FAIL in the study; the one that takes it over names it (its ``resumes`` attribute) and keeps its
    job (``job``: a trial that resumed another and was stopped in turn passes on the first one's folder)."""
    for stopped in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.enqueue_trial(stopped.params, user_attrs={"resumes": stopped.number, JOB: job_number(stopped)})
        _told(study, stopped.number, state=TrialState.FAIL)
        log.info("trial %d was stopped before it ended (%s): it runs again first, resuming its folder",
                 stopped.number, stopped.params)


@dataclass
class Settings:
    """conf/hydra/sweeper/optuna.yaml's keys, but the sampler and the pruner (made by Hydra from their groups)."""

    direction: str = "maximize"  # every objective of the project (accuracy, F1, MCC, r) is higher-is-better
    study_name: Optional[str] = None
    storage: Optional[str] = None
    n_trials: int = 20
    n_jobs: int = 2
    asynchronous: bool = True
    poll_interval: float = 5.0
    max_failure_rate: float = 0.0
    params: Optional[Dict[str, Any]] = None

    @classmethod
    def of(cls, settings: Dict[str, Any]) -> "Settings":
        """The settings from the sweeper's config, a key no field takes refused by name (a ``+`` adds any)."""
        known = [each.name for each in dataclasses.fields(cls)]
        unknown = [key for key in settings if key not in known]
        if unknown:
            raise ConfigError(f"hydra.sweeper.{unknown[0]} is not a setting of the Optuna sweeper: it takes "
                              f"{', '.join(known)}, with sampler and pruner")
        try:  # each value as its field's type takes it: n_trials=x or asynchronous=maybe refused, not read as truthy
            typed = OmegaConf.merge(OmegaConf.structured(cls), settings)
        except OmegaConfBaseException as error:
            key = f"hydra.sweeper.{error.full_key}"
            raise ConfigError(f"{key}={settings.get(str(error.full_key))}: {str(error).splitlines()[0]}") from None
        return cast(Settings, OmegaConf.to_object(typed))

    def __post_init__(self) -> None:
        if self.direction not in ("minimize", "maximize"):
            raise ConfigError(f"hydra.sweeper.direction={self.direction}: minimize or maximize")
        for key in ("n_trials", "n_jobs"):
            if getattr(self, key) < 1:
                raise ConfigError(f"hydra.sweeper.{key}={getattr(self, key)} must be at least 1")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ConfigError(f"hydra.sweeper.max_failure_rate={self.max_failure_rate} must be in [0, 1]")
        if not self.poll_interval > 0:
            raise ConfigError(f"hydra.sweeper.poll_interval={self.poll_interval} must be more than 0 seconds")
        if self.storage is not None and self.storage.startswith(JOURNAL) and not self.storage[len(JOURNAL):]:
            raise ConfigError(f"hydra.sweeper.storage={self.storage}: name the journal file, e.g. "
                              f"{JOURNAL}/shared/sweeps/study.journal")

    def study_storage(self) -> Union[None, str, optuna.storages.BaseStorage]:
        """Optuna's storage: a database URL as it is, or ``journal:<file>``, Optuna's journal file storage, safe
        on a filesystem that several machines share (Slurm's nodes), where SQLite's locks are not."""
        if self.storage is None or not self.storage.startswith(JOURNAL):
            return self.storage
        path = Path(self.storage[len(JOURNAL):])
        path.parent.mkdir(parents=True, exist_ok=True)
        _check_journal(path, f"hydra.sweeper.storage={self.storage}")
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


def _check_journal(path: Path, where: str) -> None:
    """Each line of a journal file, checked before Optuna opens it: its reader passes a last line that is not a
    whole entry (a write in progress, it assumes) and its next write goes after that line, which leaves the file
    unreadable from then on."""
    if not path.is_file():
        return
    with open(path, "rb") as journal:
        for number, line in enumerate(journal, 1):
            try:
                json.loads(line)
                whole = line.endswith(b"\n")
            except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
                whole = False
            if not whole:
                raise ConfigError(f"{where}: line {number} of {path} is not a whole entry of Optuna's journal: remove "
                                  "it where a write was cut short there, or move the file aside to start a new study")


def open_study(settings: Settings, sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner
               ) -> optuna.Study:
    """The search's study, new or continued. Refused by name, before any trial: a storage that holds no study
    Optuna can read (a damaged file; tables of another Optuna version, whose message says how to upgrade), and a
    study continued in the other direction (Optuna keeps the stored one: the sampler would seek the opposite of
    what the search reports as best)."""
    where = f"hydra.sweeper.storage={settings.storage}"

    def opened() -> optuna.Study:
        storage = settings.study_storage()
        if isinstance(storage, str):  # opened here, where its errors are the storage's alone
            storage = optuna.storages.get_storage(storage)
        return optuna.create_study(study_name=settings.study_name, storage=storage, sampler=sampler, pruner=pruner,
                                   load_if_exists=True, direction=StudyDirection[settings.direction.upper()])

    try:
        study = _patient(opened, "opening the study")
    except StudyLocked as error:
        raise ConfigError(f"{where}: {error}") from None
    except (SQLAlchemyError, ImportError, json.JSONDecodeError) as error:
        raise ConfigError(f"{where}{unopened(str(settings.storage), error)}") from None
    except RuntimeError as error:  # RDBStorage's check of its tables' version
        raise ConfigError(f"{where}: {error}") from None
    stored = study.direction.name.lower()
    if stored != settings.direction:
        raise ConfigError(f"hydra.sweeper.direction={settings.direction}: the study {study.study_name} in {where} "
                          f"was started to {stored} ({_trials(len(study.trials))}): continue it with "
                          f"hydra.sweeper.direction={stored}, or start another (hydra.sweeper.study_name)")
    return study


def study_file(storage: Optional[str]) -> Optional[Path]:
    """The file that holds the study: SQLite's database or Optuna's journal; None for a study in memory or on a
    database server."""
    if storage is None:
        return None
    if storage.startswith(JOURNAL):
        return Path(storage[len(JOURNAL):])
    try:
        url = make_url(storage)
    except ArgumentError:  # open_study refuses it first
        return None
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)


def claim_study(settings: Settings, study_name: str) -> Optional[Claim]:
    """One command at a time on a study kept in a file: a claim beside the file, by study (the one a sweep takes
    of its folder, nli.io.claim), held while the search runs. A second command on the study, from another sweep
    folder, would take the first one's running trials for stopped ones: fail them in the study (the first then
    fails as it tells their end), and run them again in its own folder. A claim its command left behind (killed
    outright) is taken over as a sweep's is."""
    path = study_file(settings.storage)
    if path is None:
        return None
    use = Use("search", f".{path.name}.{re.sub(r'[^A-Za-z0-9_.-]', '_', study_name)}.claim.json",
              "give this search another hydra.sweeper.study_name or hydra.sweeper.storage")
    where = f"hydra.sweeper.storage={settings.storage}"
    try:
        return Claim.take(Storage(str(path.parent.absolute()), key="hydra.sweeper.storage"), use=use)
    except ClaimedError as error:
        holder = str(error).partition(f"in use by another {use.holder}: ")[2] or str(error)
        raise ConfigError(f"{where}: the study {study_name} is in use by another search: {holder}") from None
    except StorageError as error:
        raise ConfigError(f"{where}: the study {study_name} cannot be claimed for this search: {error}") from None


# The packages that give SQLAlchemy a database's driver, by the module it imports, where their names differ.
DRIVERS = {"psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient", "pymysql": "PyMySQL"}


def unopened(url: str, error: BaseException) -> str:
    """Why a storage could not be opened, after its key: only a file that holds no study is to be moved aside (the
    advice, followed for a locked or unreachable study, would throw a healthy one away)."""
    first = str(error).splitlines()[0]
    if isinstance(error, ImportError):  # Optuna's, from the driver's ModuleNotFoundError
        module = getattr(error.__cause__, "name", None) or "its driver"
        return (f": the database driver {module} is not installed: pip install {DRIVERS.get(module, module)}, or "
                "keep the study in a file (sqlite:///<path>/optuna.db)")
    if isinstance(error, ArgumentError):  # not a URL, or a database SQLAlchemy has no dialect for
        return (f" is not a database URL SQLAlchemy reads ({first}): give sqlite:///<path>/optuna.db (three "
                "slashes before a relative path, four before an absolute one) or journal:<file>")
    if isinstance(error, OperationalError) and "unable to open database file" in first:
        folder = Path(str(make_url(url).database or "")).parent
        if not folder.is_dir():
            return f": the folder {folder} does not exist: make it, or give the study a file in a folder that does"
        return f": {folder} does not let this user make or open the study's file there ({first})"
    return (f" cannot be read as an Optuna study ({first}): move that file aside to start a new study there (the "
            "trials' folders stay), or give hydra.sweeper.storage another one")


def _trials(count: int) -> str:
    return "1 trial" if count == 1 else f"{count} trials"


def syntax(drawn: BaseDistribution) -> str:
    """A distribution as Hydra's sweep syntax writes it (:func:`distribution`'s inverse), for a message."""
    if isinstance(drawn, CategoricalDistribution):
        return f"choice({', '.join(str(each) for each in drawn.choices)})"
    assert isinstance(drawn, (FloatDistribution, IntDistribution))
    if drawn.step is not None:  # range() leaves its end out: one step past the last value
        return f"range({_number(drawn.low)}, {_number(drawn.high + drawn.step)}, {_number(drawn.step)})"
    interval = f"interval({_number(drawn.low)}, {_number(drawn.high)})"
    return f"tag(log, {interval})" if drawn.log else interval


def _number(value: float) -> str:
    return str(round(value, 12))  # 0.30000000000000004 (0.2 + 0.1) as the 0.3 typed


def check_space(study: optuna.Study, space: Space, where: str) -> None:
    """Refuse, before any trial, a continued study's key drawn from a distribution Optuna cannot put beside the
    stored one (a choice() of other values, another kind, a log scale added or dropped): Optuna raises it only at
    the trial's ask, in a traceback, after the trial is made."""
    stored: Dict[str, Tuple[BaseDistribution, int]] = {}
    for trial in study.get_trials(deepcopy=False):
        for key, drawn in trial.distributions.items():
            first, count = stored.get(key, (drawn, 0))
            stored[key] = (first, count + 1)
    for key, new in space.items():
        if key not in stored:
            continue
        old, count = stored[key]
        try:
            optuna.distributions.check_distribution_compatibility(old, new)  # the rule Optuna's storage applies
        except ValueError as error:
            raise ConfigError(f"{key}={syntax(new)}: the study {study.study_name} in {where} drew {key} from "
                              f"{syntax(old)} ({_trials(count)}), and Optuna cannot continue it with another "
                              f"({str(error).rstrip('.')}): give {key}='{syntax(old)}' to continue the study, or "
                              "start another (another hydra.sweeper.study_name or hydra.sweeper.storage)") from None


FIXED = "fixed"  # a study's user attribute: the settings its trials share, as typed (check_fixed)


def check_fixed(study: optuna.Study, fixed: Dict[str, str], where: str) -> None:
    """Refuse a continued study given other settings than its trials share (another checkpoint whose name ends
    alike, ``.../model`` of another run; another max_steps): its sampler would learn from another model's trials,
    and its best trial could be one of them. Settings that change nothing computed (hw, logger, ...:
    nli.config.identity.EXCLUDED) may differ. A study from before this check records its settings now."""
    shared = {key: value for key, value in fixed.items()
              if not any(key.lstrip("+~") == x or key.lstrip("+~").startswith(f"{x}.") for x in EXCLUDED)}
    trials = len(study.get_trials(deepcopy=False))
    stored = study.user_attrs.get(FIXED)
    if stored is None or not trials:
        _patient(lambda: study.set_user_attr(FIXED, shared), "recording the study's settings")
        return
    changed = [f"{key}: {stored.get(key, '(not given)')} -> {shared.get(key, '(not given)')}"
               for key in sorted({*stored, *shared}) if stored.get(key) != shared.get(key)]
    if changed:
        raise ConfigError(f"the study {study.study_name} in {where} ran its {_trials(trials)} with other settings "
                          f"({'; '.join(changed)}), and its sampler and best trial would mix them with this "
                          "command's: give the same settings to continue it, or start another (another "
                          "hydra.sweeper.study_name or hydra.sweeper.storage)")


TOKEN = "token"  # a study's user attribute: made by the first command that opens it (study_key)


def study_key(study: optuna.Study) -> str:
    """What the sweep's rows call the study (their ``study`` column, nli.sweep.table), the same for every command
    that continues it: its name and a token it keeps. Not its name and storage alone: a study begun anew under both
    (its file moved aside, as a refused file's message advises) is another study, whose trials are not its."""
    token = study.user_attrs.get(TOKEN)
    if token is None:
        token = secrets.token_hex(4)
        _patient(lambda: study.set_user_attr(TOKEN, token), "recording the study's token")
    return f"{study.study_name} {token}"


# A trial's user attribute: its job number, and so its folder, where that is not its number in the study: the
# stopped trial's it resumes, or the next free one past a folder another study's run holds (_free_job).
JOB = "job"


def job_number(trial: Union[optuna.Trial, optuna.trial.FrozenTrial]) -> int:
    """A trial's job number, and so its folder (``${hydra.job.num}``): its number in the study, unique across the
    commands that continue it, or that of the stopped trial it resumes, whose folder it takes up again, or the
    free number it took past another study's folders (``job``; a study from before ``job`` was kept names the
    stopped trial alone, in ``resumes``)."""
    return int(trial.user_attrs.get(JOB, trial.user_attrs.get("resumes", trial.number)))


def record(config: DictConfig) -> None:
    """Hydra's record of the sweep, multirun.yaml at its top, as Hydra's basic sweeper writes it before its first
    job: what a search sought (``hydra.sweeper.direction``: the report's best are the lowest where it minimized) and
    how many trials it runs (nli.sweep.report), and what marks the folder a sweep's (nli.config.command)."""
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(config, sweep_dir / MULTIRUN_RECORD)


def _holds_a_run(folder: str) -> bool:
    """Whether a run has written into ``folder`` (local, or in a bucket)."""
    return bool(Storage(folder, key="the trial's folder").list(""))


def _free_job(trial: optuna.Trial, folder_of: Callable[[int], str]) -> int:
    """A new trial's job number: its number in the study, or past it where that folder holds a run another study
    left in the sweep's folder (a study file moved aside, a study in memory run again, one Optuna named anew):
    there the trial would fail on that run's settings, or, drawn the same values, take its results for its own.
    Recorded on the trial (``job``), for a command that resumes it to find its folder. A folder the number does not
    name (one output_dir for every trial) is left to the run's own check."""
    taken = {job_number(each) for each in trial.study.get_trials(deepcopy=False) if each.number != trial.number}
    num = trial.number
    if folder_of(num) == folder_of(num + 1):
        return num
    while num in taken or _holds_a_run(folder_of(num)):
        num += 1
    if num != trial.number:
        why = (f"another trial of this study is job {trial.number}" if trial.number in taken
               else f"{folder_of(trial.number)} holds a run of another study")
        log.info("trial %d: %s: the trial is job %d", trial.number, why, num)
        _patient(lambda: trial.set_user_attr(JOB, num), f"recording trial {trial.number}'s job number")
    return num


class OptunaSearch:
    """Asks the study for trials, runs them through the launcher, up to ``n_jobs`` at a time and the next as soon
    as one ends (nli.sweep.slots), has the pruner judge them as they train (nli.sweep.pruning), and tells the
    study how each ended (for hydra_plugins.nli_optuna_sweeper, the plugin Hydra finds)."""

    def __init__(self, sampler: Any, settings: Settings, pruner: Optional[optuna.pruners.BasePruner] = None) -> None:
        self.sampler, self.settings = sampler, settings
        self.pruner = pruner if pruner is not None else optuna.pruners.NopPruner()
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.launcher: Optional[Launcher] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context,
                                                                task_function=task_function)
        if getattr(getattr(self.launcher, "settings", None), "wait", True) is False:
            raise ConfigError("hydra.launcher.wait=false hands each job back as soon as it is submitted, and a search "
                              "needs each trial's objective before it draws the next: drop it for a search")
        if getattr(getattr(self.launcher, "settings", None), "dry_run", False) is True:
            raise ConfigError("hydra.launcher.dry_run=true submits nothing, so a search's trials would end without an "
                              "objective, each recorded in the study as failed: dry-run the jobs of a list instead "
                              "(drop hparams_search and hydra/sweeper, give each key one value or a list)")

    @property
    def prunes(self) -> bool:
        return not isinstance(self.pruner, optuna.pruners.NopPruner)

    def sweep(self, arguments: List[str]) -> None:
        assert self.config is not None and self.launcher is not None
        own = [f"{key!s}={value}" for key, value in (self.settings.params or {}).items()]
        space, fixed = search_space([*own, *arguments])
        if not space:  # else n_trials trials of the same config, each a run of its own
            raise ConfigError("the search has nothing to search: no key is given values to draw from. Give one a "
                              "range (python train.py -m hydra/sweeper=optuna 'optimizer.lr=tag(log,interval(1e-5,"
                              "1e-3))', docs/sweeps.md), or run once without -m")
        sampler, n_trials = self._sampler(space)
        where = f"hydra.sweeper.storage={self.settings.storage}"
        study = open_study(self.settings, sampler, self.pruner)
        with contextlib.ExitStack() as held:
            claim = claim_study(self.settings, study.study_name)
            if claim is not None:
                held.enter_context(claim)
            check_space(study, space, where)
            check_fixed(study, fixed, where)
            record(self.config)
            table.join_study(Path(str(self.config.hydra.sweep.dir)), study_key(study), claim)
            try:
                self._search(study, sampler, space, fixed, n_trials)
            except StudyLocked as error:  # a trial left RUNNING: the next command takes it up, from its folder
                raise ConfigError(f"{where}: {error}") from None

    def _search(self, study: optuna.Study, sampler: optuna.samplers.BaseSampler, space: Space,
                fixed: Dict[str, str], n_trials: int) -> None:
        """Runs the trials, the next as soon as one ends, and ends as the search ends."""
        assert self.launcher is not None
        if isinstance(sampler, optuna.samplers.GridSampler):
            n_trials = self._untried(study, space, n_trials)
        slots = Slots(self.launcher, self.settings.n_jobs, asynchronous=self.settings.asynchronous)
        log.info("study %s in %s: %d trials, %s; %s, %s", study.study_name, self.settings.storage or "memory",
                 n_trials, slots.describe(), type(sampler).__name__, type(self.pruner).__name__)
        _resume_stopped(study)
        jobs: Dict[int, int] = {}  # trial number -> its job number in this command's table
        failure = self._trials(study, slots, space, fixed, n_trials, jobs)
        self._best(study, jobs)
        if failure is not None:
            _raise(failure, self.settings.max_failure_rate)

    def _trials(self, study: optuna.Study, slots: Slots, space: Space, fixed: Dict[str, str], n_trials: int,
                jobs: Dict[int, int]) -> Optional[Launched]:
        """Runs up to ``n_trials`` trials, numbered into ``jobs`` as each starts. Returns the first failed trial
        where more than ``max_failure_rate`` of them failed (its error ends the search), else None."""
        failed: List[Launched] = []
        stopped = False  # past max_failure_rate: no new trial, those in flight end first
        with Watch(self.settings.poll_interval) as watch:
            while (len(jobs) < n_trials and not stopped) or slots.busy:
                refused: List[Launched] = []
                while len(jobs) < n_trials and not stopped and slots.free():
                    job = self._asked(study, space, fixed, jobs)
                    jobs[job.trial.number] = job.num
                    if job.error is not None:  # never launched: told now, before the next is asked for
                        refused.append(job)
                        break
                    if self.prunes and job.folder is not None:
                        watch.add(job.trial, job.folder)
                    slots.start(job)
                for job in refused or slots.wait():
                    watch.last(job.trial)
                    if self._tell(study, job):
                        failed.append(job)
                        # The share of this command's trials: a failure among the first few is within it.
                        stopped = stopped or len(failed) / n_trials > self.settings.max_failure_rate
                    else:  # kept as each trial ends: a search stopped by Ctrl-C or SIGTERM has it as it stopped
                        self._save_best(study)
        return failed[0] if stopped else None

    def _sampler(self, space: Space) -> Tuple[optuna.samplers.BaseSampler, int]:
        """The sampler, and the trials to run: a grid has as many as its points at most."""
        if isinstance(self.sampler, functools.partial):  # the grid sampler, made once the space is known
            points = grid(space)
            size = math.prod(len(values) for values in points.values())
            return self.sampler(search_space=points), min(self.settings.n_trials, size)
        return self.sampler, self.settings.n_trials

    def _asked(self, study: optuna.Study, space: Space, fixed: Dict[str, str], jobs: Dict[int, int]) -> Launched:
        """The next trial's job. A trial asked for that gets no job (its values not drawn, its config not
        composed) is FAIL at once: left RUNNING, the next command would take it for a stopped trial and resume a
        folder that never existed. (Ctrl-C leaves it RUNNING, as it leaves the trials in flight.)"""
        try:
            trial = study.ask(space)
            return self._job(trial, fixed)
        except Exception:
            for running in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                if running.number not in jobs:  # this command's trials in flight are in jobs; earlier ones were told
                    _told(study, running.number, state=TrialState.FAIL)
            raise

    @staticmethod
    def _untried(study: optuna.Study, space: Space, n_trials: int) -> int:
        """The trials a grid search runs: its points no finished trial of the study has tried (past them, Optuna's
        grid sampler draws tried points again); a stopped trial's point is untried (it runs again first)."""
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
        points = grid(space)
        tried = {tuple(trial.params.get(key) for key in points) for trial in finished}
        untried = [point for point in itertools.product(*points.values()) if point not in tried]
        if len(untried) < n_trials:
            log.info("the grid's points: %d, %d untried in study %s: this command runs %d trial(s)",
                     math.prod(len(values) for values in points.values()), len(untried), study.study_name,
                     len(untried))
        return min(n_trials, len(untried))

    def _job(self, trial: optuna.Trial, fixed: Dict[str, str]) -> Launched:
        """The trial's job: its number, its overrides, and the folder it writes (where the pruner reads its
        evaluations)."""
        assert self.config is not None and self.hydra_context is not None
        overrides = [*(f"{key}={value}" for key, value in trial.params.items()),
                     *(f"{key}={value}" for key, value in fixed.items())]
        try:
            config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        except ConfigCompositionException as error:  # a drawn value its key's type refuses (interval() of an int)
            what = ": ".join(str(each).splitlines()[0] for each in (error, error.__cause__) if each is not None)
            raise ConfigError(f"trial {trial.number}: {what}: give that key a range of values its type takes (an "
                              "integer key: choice() or range())") from None
        own = getattr(self.launcher, "run_folder", None)  # the Vertex launcher's: the job's folder in the bucket
        folder_of: Callable[[int], str] = ((lambda n: own(overrides, n)) if own else
                                           (lambda n: run_folder(cast(DictConfig, self.config), config, n)))
        num = job_number(trial)
        if JOB not in trial.user_attrs and "resumes" not in trial.user_attrs:  # not resuming a stopped trial
            num = _free_job(trial, folder_of)
        folder = folder_of(num)
        log.info("trial %d is job %d: %s", trial.number, num, " ".join(overrides))
        job = Launched(trial, num, overrides, folder)
        refused = job_refusal(config) or trial_refusal(config)
        if refused is not None:  # drawn with a value the rules refuse, or data not there: it would start only to fail
            self._refuse(job, refused)
        return job

    def _refuse(self, job: Launched, why: str) -> None:
        """A trial failed without a launch: its error, and its row in the sweep's table (no job writes one)."""
        assert self.config is not None and job.folder is not None
        job.error = TrialRefused(f"not launched: the trial would stop as it starts: {why}")
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        table.record(sweep_dir, table.job_row(num=job.num, state=JobStatus.FAILED.name, overrides=job.overrides,
                                              results=None, output_dir=job.folder, error=str(job.error),
                                              **table.running_sweep(sweep_dir)))

    @staticmethod
    def _tell(study: optuna.Study, job: Launched) -> bool:
        """Tell the study how a trial ended; True where it failed. A trial is pruned where its run says so: the
        pruner may have given it up after its last evaluation, and then it trained to its end."""
        trial, result = job.trial, job.result
        value = result._return_value if result is not None and result.status == JobStatus.COMPLETED else None
        try:
            number = float(value) if value is not None else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if math.isnan(number):
            _told(study, trial, state=TrialState.FAIL)
            if _undefined(value):
                log.warning("trial %d (job %d) counts as failed: it ended with objective nan, which the study cannot "
                            "rank (%s; its results: %s)", trial.number, job.num, UNDEFINED, job.folder)
                return True
            why = (job.error if job.error is not None or result is None else
                   result._return_value if value is None else f"its task returned {value!r}, not a number")
            log.warning("trial %d failed: %s", trial.number, why)
            return True
        if ended_pruned(job.folder):
            _told(study, trial, state=TrialState.PRUNED)
            log.info("trial %d (job %d) was pruned: its best objective before it stopped, %s", trial.number, job.num,
                     number)
            return False
        _told(study, trial, number)
        return False

    def _best(self, study: optuna.Study, jobs: Dict[int, int]) -> None:
        """Say the best of this command's trials by its row of the sweep's table, and the study's best where an
        earlier command ran it (optimization_results.yaml holds the study's)."""
        assert self.config is not None
        done = [trial for trial in study.trials if trial.state == TrialState.COMPLETE]
        if not done:
            log.warning("no trial of study %s has completed: no best values yet", study.study_name)
            return
        pick = max if self.settings.direction == "maximize" else min
        ours = [trial for trial in done if trial.number in jobs]
        if ours:
            here = pick(ours, key=lambda trial: cast(float, trial.value))
            log.info("best of this command's trials: job %d of the sweep's table, %s, objective %s",
                     jobs[here.number], here.params, here.value)
        best = study.best_trial
        if best.number not in jobs:  # in the table printed next, where its row says the study (table.of_study)
            log.info("the study's best (of %d completed trials): trial %d of an earlier command, job %d of the sweep's "
                     "table, %s, objective %s", len(done), best.number, job_number(best), best.params, best.value)
        self._save_best(study)

    def _save_best(self, study: optuna.Study) -> None:
        """optimization_results.yaml: the study's best trial so far, where one has completed."""
        assert self.config is not None
        if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            return
        best = study.best_trial
        OmegaConf.save(OmegaConf.create({"name": "optuna", "best_params": best.params, "best_value": best.value}),
                       f"{self.config.hydra.sweep.dir}/{RESULTS_FILE}")
