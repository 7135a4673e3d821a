"""The Optuna sweeper's search space (nli/sweep/search.py): Hydra's sweep syntax read as Optuna distributions; and
the record of a search it leaves in the sweep's folder. Its searches run: tests/sweeps/test_sweep.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from nli.errors import ConfigError
from nli.sweep.search import grid, search_space
from tests.support.runs import FAST, run_app


def test_each_form_of_the_syntax_is_its_distribution() -> None:
    space, fixed = search_space(["optimizer.lr=tag(log, interval(1e-4, 1e-2))", "train.batch_size=choice(16, 32)",
                                 "schedule.warmup_ratio=interval(0.0, 0.2)", "train.epochs=interval(1, 4)",
                                 "data.bucket=range(10, 50, 20)", "seed=3"])
    assert space == {"optimizer.lr": FloatDistribution(1e-4, 1e-2, log=True),
                     "train.batch_size": CategoricalDistribution([16, 32]),
                     "schedule.warmup_ratio": FloatDistribution(0.0, 0.2),
                     "train.epochs": FloatDistribution(1.0, 4.0),  # Hydra reads an interval's ends as floats
                     "data.bucket": IntDistribution(10, 30, step=20)}  # range's values: 10, 30 (as Hydra runs them)
    assert fixed == {"seed": "3"}


def test_the_command_lines_key_replaces_the_searchs_own() -> None:
    own = ["optimizer.lr=tag(log, interval(1e-4, 1e-2))", "train.batch_size=choice(16, 32)"]
    space, fixed = search_space([*own, "optimizer.lr=tag(log,interval(2e-4,3e-4))", "train.batch_size=16"])
    assert space == {"optimizer.lr": FloatDistribution(2e-4, 3e-4, log=True)}
    assert fixed == {"train.batch_size": "16"}


def test_a_grid_lists_each_keys_values_and_refuses_a_continuous_range() -> None:
    space, _ = search_space(["train.batch_size=choice(16, 32)", "schedule.warmup_ratio=range(0.0, 0.3, 0.1)"])
    points = grid(space)
    assert points["train.batch_size"] == [16, 32]
    assert points["schedule.warmup_ratio"] == pytest.approx([0.0, 0.1, 0.2])
    with pytest.raises(ConfigError, match="optimizer.lr is drawn from .*give it as choice"):
        grid(search_space(["optimizer.lr=interval(1e-4, 1e-3)"])[0])


def test_an_empty_range_is_refused_by_its_key() -> None:
    with pytest.raises(ConfigError, match=r"train.epochs=range\(5, 1\): the range holds no value"):
        search_space(["train.epochs=range(5, 1)"])


def test_a_trial_left_running_is_run_again_first_with_its_values() -> None:
    """A search stopped mid-trial (Ctrl-C, SIGTERM) leaves it RUNNING: the next command runs its values again
    (its folder, named by them, resumes) and the stopped one is FAIL, not RUNNING for good."""
    import optuna

    from nli.sweep.search import _resume_stopped

    space, _ = search_space(["optimizer.lr=tag(log, interval(1e-4, 1e-2))", "train.batch_size=choice(16, 32)"])
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    stopped = study.ask(space)  # the command stopped here
    _resume_stopped(study)
    again = study.ask(space)
    assert again.params == stopped.params and again.user_attrs == {"resumes": stopped.number, "job": stopped.number}
    assert study.trials[stopped.number].state == optuna.trial.TrialState.FAIL
    assert study.ask(space).params != stopped.params  # then new values


def test_a_trial_that_resumed_a_stopped_one_and_was_stopped_in_turn_resumes_the_first_ones_folder() -> None:
    """Stopped twice (SIGTERM in trial 0, then again in trial 1, which resumed it): the third command's trial took
    trial 1's number for its folder, trial=1, which no run ever wrote, and trained from scratch there, the
    checkpoints in trial=0 left behind."""
    import optuna

    from nli.sweep.search import _resume_stopped, job_number

    space, _ = search_space(["optimizer.lr=tag(log, interval(1e-4, 1e-2))"])
    study = optuna.create_study(direction="maximize")
    first = study.ask(space)  # the first command stopped here
    _resume_stopped(study)  # the second command
    second = study.ask(space)  # and stopped here, in the trial that resumed it
    assert job_number(second) == first.number == 0
    _resume_stopped(study)  # the third command
    third = study.ask(space)
    assert (third.number, job_number(third), third.params) == (2, 0, first.params)
    assert third.user_attrs["resumes"] == second.number  # the trial it took over, as the study records it


@pytest.mark.parametrize("settings, message", [
    ({"direction": "maximise"}, "hydra.sweeper.direction=maximise: minimize or maximize"),
    ({"n_jobs": 0}, "hydra.sweeper.n_jobs=0 must be at least 1"),
    ({"max_failure_rate": 1.5}, r"hydra.sweeper.max_failure_rate=1.5 must be in \[0, 1\]"),
])
def test_a_bad_sweeper_value_is_refused_by_its_key(settings: dict, message: str) -> None:
    from nli.sweep.search import Settings

    with pytest.raises(ConfigError, match=message):
        Settings(**settings)


def test_a_sampler_or_pruner_option_it_does_not_take_is_refused_by_name_with_the_way_out() -> None:
    """hparams_search=quickstart sets n_startup_trials for TPE; with hydra/sweeper/sampler=random it is left over."""
    from omegaconf import OmegaConf

    from nli.sweep.search import made

    left_over = OmegaConf.create({"_target_": "optuna.samplers.RandomSampler", "seed": None, "n_startup_trials": 4})
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.sampler.n_startup_trials: optuna.samplers.RandomSampler "
                                          r"takes no n_startup_trials; leave it out with "
                                          r"'~hydra.sweeper.sampler.n_startup_trials'$"):
        made(left_over, "sampler")
    no_bound = OmegaConf.create({"_target_": "optuna.pruners.ThresholdPruner", "lower": None, "upper": None})
    with pytest.raises(ConfigError, match=r"^hydra.sweeper.pruner \(optuna.pruners.ThresholdPruner\): Either lower or "
                                          r"upper must be specified"):
        made(no_bound, "pruner")
    import optuna

    assert isinstance(made(OmegaConf.create({"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 2}),
                           "pruner"), optuna.pruners.MedianPruner)


def test_a_searchs_folder_holds_hydras_record_of_it_as_a_list_sweeps_does(tmp_path: Path) -> None:
    """Hydra's basic sweeper writes multirun.yaml at the sweep's top, the project's Optuna sweeper did not: a search's
    folder had no record of which way it sought its objective nor of its trials (nli.sweep.report reads them), nor
    the mark by which a run into a sweep's folder is refused (nli.config.command)."""
    sweep_dir = tmp_path / "search"
    done = run_app(["-m", *FAST, "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=1",
                    "hydra.sweeper.direction=minimize", "optimizer.lr=choice(1e-3,2e-3)",
                    f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    sweeper = yaml.safe_load((sweep_dir / "multirun.yaml").read_text())["hydra"]["sweeper"]
    assert sweeper["direction"] == "minimize" and sweeper["n_trials"] == 1
    assert sweeper["_target_"] == "hydra_plugins.nli_optuna_sweeper.optuna_sweeper.OptunaSweeper"
