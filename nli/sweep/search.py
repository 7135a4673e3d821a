"""The project's Optuna search (``hydra/sweeper=optuna``, and the searches of conf/hparams_search/), on
current Optuna.

A search's space is Hydra's sweep syntax, by key: ``hydra.sweeper.params`` (the search's own) and the
command line's keys, which replace the search's range for a key (a range) or take the key out of the
search (one value). ``choice(a, b)`` is a categorical; ``interval(a, b)`` a float (Hydra reads its ends
as floats), ``tag(log, interval(a, b))`` on a log scale; ``range(a, b, step)`` the values Hydra's basic
sweeper would run, ``a, a+step, ...`` short of ``b`` (ints where all are).

The study is ``hydra.sweeper.storage`` (SQLite: ``sqlite:///<sweep dir>/optuna.db``), so the same command
again continues it, its sampler seeing every earlier trial; ``hydra.sweeper.n_trials`` more trials each time.
Trials run through the configured launcher, ``n_jobs`` at a time; a trial whose job failed (a diverged
learning rate) is FAIL in the study, and the search goes on while the failed share stays within
``max_failure_rate``. ``optimization_results.yaml`` in the sweep directory holds the best trial so far.

Light on purpose (no torch): the sweep's own process runs it, before any job.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, RangeSweep, Transformer
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.study import StudyDirection
from optuna.trial import TrialState

from nli.errors import ConfigError

log = logging.getLogger(__name__)

RESULTS_FILE = "optimization_results.yaml"
Space = Dict[str, BaseDistribution]


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


def _resume_stopped(study: optuna.Study) -> None:
    """Trials an earlier command left RUNNING (stopped by Ctrl-C or SIGTERM, their checkpoints kept) are run again
    first, with the same values: their folders, named by the values, resume where they stopped. The stopped
    trial is FAIL in the study; the one that takes it over names it (its ``resumes`` attribute)."""
    for stopped in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.enqueue_trial(stopped.params, user_attrs={"resumes": stopped.number})
        study.tell(stopped.number, state=TrialState.FAIL)
        log.info("trial %d was stopped before it ended (%s): it runs again first, resuming its folder",
                 stopped.number, stopped.params)


@dataclass
class Settings:
    """conf/hydra/sweeper/optuna.yaml's keys, but the sampler (made by Hydra from its own group)."""

    direction: str = "minimize"
    study_name: Optional[str] = None
    storage: Optional[str] = None
    n_trials: int = 20
    n_jobs: int = 2
    max_failure_rate: float = 0.0
    params: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        if self.direction not in ("minimize", "maximize"):
            raise ConfigError(f"hydra.sweeper.direction={self.direction}: minimize or maximize")
        for key in ("n_trials", "n_jobs"):
            if getattr(self, key) < 1:
                raise ConfigError(f"hydra.sweeper.{key}={getattr(self, key)} must be at least 1")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ConfigError(f"hydra.sweeper.max_failure_rate={self.max_failure_rate} must be in [0, 1]")


class OptunaSearch:
    """Asks the study for trials, runs them through the launcher ``n_jobs`` at a time, and tells it the results
    (for hydra_plugins.nli_optuna_sweeper, the plugin Hydra finds)."""

    def __init__(self, sampler: Any, settings: Settings) -> None:
        self.sampler, self.settings = sampler, settings
        self.config: Optional[DictConfig] = None
        self.launcher: Optional[Launcher] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context,
                                                                task_function=task_function)

    def sweep(self, arguments: List[str]) -> None:
        assert self.config is not None and self.launcher is not None
        own = [f"{key!s}={value}" for key, value in (self.settings.params or {}).items()]
        space, fixed = search_space([*own, *arguments])
        sampler, n_trials = self._sampler(space)
        study = optuna.create_study(study_name=self.settings.study_name, storage=self.settings.storage, sampler=sampler,
                                    direction=StudyDirection[self.settings.direction.upper()], load_if_exists=True)
        log.info("study %s in %s: %d trials, %d at a time, %s", study.study_name, self.settings.storage or "memory",
                 n_trials, self.settings.n_jobs, type(sampler).__name__)
        _resume_stopped(study)
        jobs: Dict[int, int] = {}  # trial number -> its job number in this command's table
        failed = 0
        while len(jobs) < n_trials:
            trials = [study.ask(space) for _ in range(min(self.settings.n_jobs, n_trials - len(jobs)))]
            overrides = [[*(f"{key}={value}" for key, value in trial.params.items()),
                          *(f"{key}={value}" for key, value in fixed.items())] for trial in trials]
            returns = self.launcher.launch(overrides, initial_job_idx=len(jobs))
            jobs.update({trial.number: len(jobs) + i for i, trial in enumerate(trials)})
            failed += sum(self._tell(study, trial, result) for trial, result in zip(trials, returns))
            if failed / len(jobs) > self.settings.max_failure_rate:
                for result in returns:
                    result.return_value  # noqa: B018 - raises the first failed job's error, as Hydra's sweepers do
        self._best(study, jobs)

    def _sampler(self, space: Space) -> Tuple[optuna.samplers.BaseSampler, int]:
        """The sampler, and the trials to run: a grid has as many as its points at most."""
        if isinstance(self.sampler, functools.partial):  # the grid sampler, made once the space is known
            points = grid(space)
            size = math.prod(len(values) for values in points.values())
            return self.sampler(search_space=points), min(self.settings.n_trials, size)
        return self.sampler, self.settings.n_trials

    @staticmethod
    def _tell(study: optuna.Study, trial: optuna.Trial, result: JobReturn) -> bool:
        """Tell the study a trial's outcome; True where it failed."""
        value = result._return_value if result.status == JobStatus.COMPLETED else None
        try:
            number = float(value) if value is not None else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if math.isnan(number):
            study.tell(trial, state=TrialState.FAIL)
            log.warning("trial %d failed: %s", trial.number, result._return_value if value is None else
                        f"its task returned {value!r}, not a number")
            return True
        study.tell(trial, number)
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
        if best.number not in jobs:
            log.info("the study's best (of %d completed trials): trial %d of an earlier command (its row is in "
                     "sweep_results.jsonl), %s, objective %s", len(done), best.number, best.params, best.value)
        OmegaConf.save(OmegaConf.create({"name": "optuna", "best_params": best.params, "best_value": best.value}),
                       f"{self.config.hydra.sweep.dir}/{RESULTS_FILE}")
