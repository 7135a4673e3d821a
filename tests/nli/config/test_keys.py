"""What is typed is what runs: every key is the schema's or refused by name, whatever its prefix, and a
command refused before it starts writes nothing (nli/config/keys.py, nli/config/command.py)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator, List, Sequence, Tuple

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from nli.config.command import check, compose
from nli.config.keys import check_known, fields_of
from nli.contract import CLAIM_FILE
from nli.errors import ConfigError
from tests.conftest import compose_config
from tests.support.runs import CONF, FAST, run_app

# One misspelt key in every config group and block, as a user types it: the override, the key named,
# and the key meant.
MISSPELT = {
    "model": (["+model.revison=v1"], "model.revison", "model.revision"),
    "model/peft": (["model/peft=lora", "+model.peft.alpah=4"], "model.peft.alpah", "model.peft.alpha"),
    "model.scratch": (["+model.scratch.hiden_size=64"], "model.scratch.hiden_size", "model.scratch.hidden_size"),
    "task": (["+task.metrcs=[accuracy]"], "task.metrcs", "task.metrics"),
    "task.glue": (["task=rte", "+task.glue.index_colum=idx"], "task.glue.index_colum", "task.glue.index_column"),
    "optimizer": (["+optimizer.lrr=1e-3"], "optimizer.lrr", "optimizer.lr"),
    "schedule": (["+schedule.warmup_ratoi=0.1"], "schedule.warmup_ratoi", "schedule.warmup_ratio"),
    "precision": (["+precision.dtpye=fp32"], "precision.dtpye", "precision.dtype"),
    "hw": (["+hw.cpu_thread=1"], "hw.cpu_thread", "hw.cpu_threads"),
    "logger": (["+logger.csv.fiel=x.csv"], "logger.csv.fiel", "logger.csv.file"),
    "data": (["+data.max_seq_lenght=32"], "data.max_seq_lenght", "data.max_seq_length"),
    "train": (["++train.epocs=3"], "train.epocs", "train.epochs"),
    "train.early_stopping": (["+train.early_stopping.patiense=2"], "train.early_stopping.patiense",
                             "train.early_stopping.patience"),
    "eval": (["+eval.extras=[hans]"], "eval.extras", "eval.extra"),
    "root": (["+sed=1"], "sed", "seed"),
    "hydra": (["hydra.run.dri=x"], "hydra.run.dri", "hydra.run.dir"),
    "another block": (["+train.max_seq_length=32"], "train.max_seq_length", "data.max_seq_length"),
}


@pytest.mark.parametrize("group", MISSPELT)
def test_a_misspelt_key_is_refused_with_the_key_meant_before_anything_is_written(tmp_path: Path, group: str) -> None:
    overrides, key, meant = MISSPELT[group]
    run_dir = tmp_path / "run"
    proc = run_app(["experiment=quickstart", *overrides, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert f"error: {key} is not a key of this config: did you mean {meant}" in proc.stderr
    assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr
    assert not run_dir.exists()  # refused before Hydra made the folder


def test_a_plain_misspelling_suggests_the_key_never_a_plus(tmp_path: Path) -> None:
    # Hydra's own answer was "To append to your config use +optimizer.lrr=1e-3": the silent path.
    proc = run_app(["experiment=quickstart", "optimizer.lrr=1e-3"], cwd=tmp_path)
    assert proc.returncode == 1 and "did you mean optimizer.lr?" in proc.stderr
    assert "+optimizer" not in proc.stderr and "To append" not in proc.stderr


@pytest.fixture
def composed(monkeypatch: pytest.MonkeyPatch) -> List[List[str]]:
    """The overrides of each composition of the config in this process, in order."""
    from hydra._internal.hydra import Hydra

    found: List[List[str]] = []
    original = Hydra.compose_config

    def counted(self: Hydra, config_name: str, overrides: List[str], *args: object, **kwargs: object) -> DictConfig:
        found.append(list(overrides))
        return original(self, config_name, overrides, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Hydra, "compose_config", counted)
    return found


@pytest.mark.parametrize("overrides,compositions", [
    (["train.max_steps=2", "optimizer.lr=1e-3"], 1),  # plain keys: the run's own composition answers for them
    (["++optimizer.weight_decay=0.1"], 2),  # a ++: checked against the config the choices compose
])
def test_a_valid_command_is_checked_with_as_few_compositions_as_its_keys_need(
        overrides: List[str], compositions: int, composed: List[List[str]]) -> None:
    """Each composition is about half a second of every run's start (docs/testing.md)."""
    assert check(["experiment=quickstart", *overrides], CONF, "train").extra == []
    assert len(composed) == compositions, composed


def test_a_sweep_with_an_unknown_key_is_refused_before_any_job(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = run_app(["-m", *FAST, "seed=1,2", "++optimizer.lrr=1e-3", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert proc.returncode == 1 and "error: optimizer.lrr is not a key of this config" in proc.stderr
    assert not sweep.exists()


@pytest.mark.parametrize("typed, refused", [
    ("optimizer.lr=5e-4,abc", "optimizer.lr=abc, one job of the sweep optimizer.lr=5e-4,abc: Value 'abc' of type "
                              "'str' could not be converted to Float"),
    ("++optimizer.lr=5e-4,abc", "++optimizer.lr=abc, one job of the sweep ++optimizer.lr=5e-4,abc: Value 'abc'"),
    # A single + for a key the config sets: every job would fail on it, whatever its value.
    ("+optimizer.lr=5e-4,abc", "+optimizer.lr=5e-4,abc adds optimizer.lr, which this config already sets (0.001): "
                               "drop the + to set it (optimizer.lr=5e-4,abc)"),
    ("seed=1,2,x", "seed=x, one job of the sweep seed=1,2,x: Value 'x' of type 'str' could not be converted to "
                   "Integer"),
    ("optimizer=adamw,adamm", "optimizer=adamm, one job of the sweep optimizer=adamw,adamm: In 'train': Could not "
                              "find 'optimizer/adamm'"),
    ("eval.extra=hans,snli", "eval.extra=hans, one job of the sweep eval.extra=hans,snli: eval.extra takes a list, in "
                             "brackets: eval.extra=[hans]\n"),
])
def test_a_typo_in_one_value_of_a_sweep_is_named_before_any_job_runs(tmp_path: Path, typed: str,
                                                                      refused: str) -> None:
    sweep = tmp_path / "sweep"
    proc = run_app(["-m", *FAST, typed, f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert proc.returncode == 1 and not sweep.exists(), proc.stderr  # refused before Hydra made the folder
    assert proc.stderr.startswith(f"error: {refused}") and "HYDRA_FULL_ERROR" not in proc.stderr, proc.stderr


def test_a_sweeps_jobs_are_checked_without_composing_each(tmp_path: Path, composed: List[List[str]]) -> None:
    """Valid values of every kind pass, 400 jobs of a hundred seeds among them, each job checked by the schema's
    rules: a config composed for each combination of group options (two models), not for each job."""
    assert check(["-m", "experiment=quickstart", "seed=range(1,101)", "optimizer.lr=1e-3,2e-3",
                  "model=tiny,roberta-base", "train.max_steps=5,3", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                 CONF, "train").extra == []
    assert len(composed) <= 6, composed  # the first options; each model's; each model's jobs; the sweep's folder


NO_JOB = ". No job has run: mend the value, or drop it from the sweep\n"


@pytest.mark.parametrize("typed, refused", [
    (["optimizer.lr=-1,1e-3"], "the sweep's job optimizer.lr=-1 would stop as it starts: optimizer.lr=-1.0 must be "
                               "positive (e.g. optimizer.lr=2e-5)"),
    # Under any launcher: a Slurm job would wait in the queue first, a Vertex AI job for its machine.
    (["hydra/launcher=submitit_local", "optimizer.lr=-1,1e-3"], "the sweep's job optimizer.lr=-1 would stop as it "
                                                                "starts: optimizer.lr=-1.0 must be positive"),
    (["optimizer.lr=-1,1e-3", "seed=1,2"], "2 of the sweep's 4 jobs would stop as they start; the first, "
                                           "optimizer.lr=-1 seed=1: optimizer.lr=-1.0 must be positive"),
    (["optimizer.lr=-1,-2"], "every one of the sweep's 2 jobs would stop as they start; the first, optimizer.lr=-1: "
                             "optimizer.lr=-1.0 must be positive"),
    (["train.batch_size=0", "seed=1,2"], "every job of the sweep would stop as it starts: train.batch_size=0 must be "
                                         "positive"),
    # Valid with one of the swept options, not with the other: each job as it combines them.
    (["hw=cpu,v100", "train.batch_size=24"], "the sweep's job hw=v100 would stop as it starts: train.batch_size=24 "
                                             "must be a multiple of hw.per_device_batch_size=16"),
    # A key under a node one job's option leaves null (its composition once a traceback in this check).
    (["model/peft=lora,none", "model.peft.r=4"], "the sweep's job model/peft=none would stop as it starts: "
                                                 "model.peft.r=4 sets a key of model.peft, which is null in this "
                                                 "config: select the adapters first: model/peft=lora"),
    (["model/peft=lora,none", "model.peft={r:4}"], "the sweep's job model/peft=none would stop as it starts: "
                                                   "model.peft={r:4} sets keys of model.peft"),
    (["model=roberta-base,tiny", "data.max_seq_length=300"], "the sweep's job model=tiny would stop as it starts: "
                                                             "model.scratch.max_position_embeddings=258 must be at "
                                                             "least data.max_seq_length + 2 = 302"),
    # A glob of a group's options, as the sweeper lists them (the check's parser once failed on it, its traceback).
    (["model=glob(tin*)", "data.max_seq_length=300"], "every job of the sweep would stop as it starts: "
                                                      "model.scratch.max_position_embeddings=258"),
])
def test_a_job_of_a_sweep_the_schema_refuses_stops_the_sweep_before_any_job_runs(tmp_path: Path, typed: List[str],
                                                                                 refused: str) -> None:
    """A value the schema's rules refuse, alone or beside another swept value, would have its job fail as it
    starts: after a Slurm queue, or a Vertex AI machine's start. The sweep is refused before any job, naming it."""
    sweep = tmp_path / "sweep"
    proc = run_app(["-m", *FAST, *typed, f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    assert proc.returncode == 1 and not sweep.exists(), proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: {refused}") and proc.stderr.endswith(NO_JOB), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Launching" not in proc.stdout


def test_a_glob_of_a_groups_options_sweeps_them_and_one_that_matches_none_is_named(tmp_path: Path) -> None:
    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    assert check(["-m", "experiment=quickstart", "task=glob(r*)", "model=glob(*)", sweep], CONF, "train").extra == []
    with pytest.raises(SystemExit, match=r"^error: task=glob\(zz\*\) matches none of task's options \(anli_r1, "
                                         r"anli_r2, .*, wnli\): the sweep would have no job$"):
        check(["-m", "experiment=quickstart", "task=glob(zz*)", sweep], CONF, "train")


def test_the_jobs_of_an_experiments_own_sweep_are_checked_as_the_sweeper_makes_them(
        tmp_path: Path, hydra_restore_singletons: None) -> None:
    """An experiment's YAML that sweeps (Hydra's basic sweeper's ``params``), beside the command line's values:
    the jobs are its and the command line's, combined in the sweeper's order."""
    conf = shutil.copytree(CONF, tmp_path / "conf")
    (conf / "experiment" / "lr-sweep.yaml").write_text("# @package _global_\ndefaults:\n  - quickstart\n"
                                                       "hydra:\n  sweeper:\n    params:\n      optimizer.lr: 1e-3,-1\n")
    argv = ["-m", "experiment=lr-sweep", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    GlobalHydra.instance().clear()  # conftest keeps Hydra initialised on the project's conf/: restored after the test
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        with pytest.raises(SystemExit) as refused:
            check(argv, conf, "train")
        assert str(refused.value).startswith("error: 2 of the sweep's 4 jobs would stop as they start; the first, "
                                             "optimizer.lr=-1 seed=1: optimizer.lr=-1.0 must be positive")
        (conf / "experiment" / "lr-sweep.yaml").write_text((conf / "experiment" / "lr-sweep.yaml").read_text()
                                                           .replace("1e-3,-1", "1e-3,2e-3"))
        assert check(argv, conf, "train").extra == []


def test_a_job_checks_its_own_keys_where_the_command_line_is_left_to_hydra(tmp_path: Path) -> None:
    # With Hydra's own flags (here --config-dir) the command line is Hydra's alone; the job refuses the key.
    proc = run_app(["--config-dir", str(CONF), *FAST, "+optimizer.lrr=1e-3", f"hydra.run.dir={tmp_path / 'run'}"],
                   cwd=tmp_path)
    assert proc.returncode == 1 and "error: optimizer.lrr is not a key of this config" in proc.stderr
    assert not (tmp_path / "run" / "results.json").exists()


def test_a_run_from_python_refuses_an_unknown_key() -> None:
    with pytest.raises(ConfigError, match=r"train\.epocs is not a key of this config: did you mean train\.epochs"):
        compose(["experiment=quickstart", "++train.epocs=3"])


@pytest.mark.parametrize("overrides,message", [
    (["+model.peft.r=4"], "error: +model.peft.r=4 sets a key of model.peft, which is null in this config: select the "
     "adapters first: model/peft=lora"),
    (["model.peft.r=4"], "error: model.peft.r=4 sets a key of model.peft, which is null in this config: select the "
     "adapters first: model/peft=lora"),  # without +, Hydra's own composition fails first (an AssertionError)
    (["+task.glue.columns.x=y"], "error: +task.glue.columns.x=y sets a key of task.glue, which is null in this config"),
    (["seed.x=1"], "error: seed.x=1: seed is a value, not a group of keys"),
    # A + for a key the config sets: Hydra's answer was three lines, and a sweep over it ran into Hydra's error.
    (["+optimizer.lr=1e-3"], "error: +optimizer.lr=1e-3 adds optimizer.lr, which this config already sets (0.001): "
     "drop the + to set it (optimizer.lr=1e-3)\n"),
    (["-m", "+optimizer.lr=1e-3,2e-3"], "error: +optimizer.lr=1e-3,2e-3 adds optimizer.lr, which this config already "
     "sets (0.001): drop the + to set it (optimizer.lr=1e-3,2e-3)\n"),
    # A mapping typed for a null node: OmegaConf's merge raised an AttributeError, with its traceback.
    (["model.peft={r:4}"], "error: model.peft={r:4} sets keys of model.peft, which is null in this config: select "
     "the adapters first: model/peft=lora\n"),
    (["-m", "hydra.sweeper.params={optimizer.lr:'1e-3,2e-3'}"],
     "error: hydra.sweeper.params={optimizer.lr:'1e-3,2e-3'} sets keys of hydra.sweeper.params, which is null in "
     "this config: Hydra's basic sweeper takes it from a config file (an experiment's YAML), and the values typed "
     "as they are (optimizer.lr=1e-3,2e-3); an Optuna search (hydra/sweeper=optuna) takes it typed\n"),
    # A mapping of the user's own takes a new key with a + alone: Hydra said so in three lines and OmegaConf's.
    (["task=rte", "data.files.train=a.csv"], "error: data.files.train=a.csv adds train to data.files, a mapping of "
     "your own, and Hydra adds keys only with a +: +data.files.train=a.csv\n"),
    (["task=rte", "data.files={train:a.csv}"], "error: data.files={train:a.csv} adds train to data.files, a mapping "
     "of your own, and Hydra adds keys only with a +: +data.files={train:a.csv}\n"),
    (["hydra.job.env_set.FOO=1"], "error: hydra.job.env_set.FOO=1 adds FOO to hydra.job.env_set, a mapping of your "
     "own, and Hydra adds keys only with a +: +hydra.job.env_set.FOO=1\n"),
    # A mapping typed for a group's node: Hydra's three lines, which told to add the misspelt key with a +.
    (["optimizer={lrr:1}"], "error: optimizer.lrr is not a key of this config: did you mean optimizer.lr?"),
    # A key left ??? (Hydra's "must be given"): OmegaConf's MissingMandatoryValue, with its traceback.
    (["optimizer.lr=???"], "error: optimizer.lr has no value (it is ??? in this config): give it one "
                           "(optimizer.lr=...)\n"),
    (["-m", "optimizer.lr=???,1e-3"], "error: the sweep's job optimizer.lr=??? would stop as it starts: "
                                      "optimizer.lr has no value"),
])
def test_a_key_under_null_or_under_a_value_is_named_with_its_fix(tmp_path: Path, overrides: List[str],
                                                                  message: str) -> None:
    proc = run_app(["experiment=quickstart", *overrides], cwd=tmp_path)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("overrides,message", [
    (["train.epochs=abc"], "Value 'abc' of type 'str' could not be converted to Float"),
    (["model=robrta"], "Could not find 'model/robrta'"),
    (["~train.epochs"], "does not support deletion"),
    (["optimizer.lr=-1"], "optimizer.lr=-1.0 must be positive"),
    # A value its key's type refuses: one line, the override first; not OmegaConf's full_key and class names.
    (["train.epochs=abc"], "error: train.epochs=abc: Value 'abc' of type 'str' could not be converted to Float\n"),
    (["eval.extra=snli"], "error: eval.extra=snli: eval.extra takes a list, in brackets: eval.extra=[snli]\n"),
    (["train.accept_changes=train.max_steps"], "error: train.accept_changes=train.max_steps: train.accept_changes "
                                                "takes a list, in brackets: train.accept_changes=[train.max_steps]\n"),
])
def test_a_command_hydra_or_the_schema_refuses_is_one_message_and_no_folder(tmp_path: Path, overrides: List[str],
                                                                            message: str) -> None:
    proc = run_app(["experiment=quickstart", *overrides, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and message in proc.stderr
    assert proc.stderr.count(message) == 1 and "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_run_dir_that_cannot_be_made_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file where the folder would go")
    proc = run_app([*FAST, f"hydra.run.dir={tmp_path / 'taken' / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"error: hydra.run.dir={tmp_path / 'taken' / 'run'}: {tmp_path / 'taken'} is a file, not a folder" \
        in proc.stderr


@pytest.mark.parametrize("under", [False, True], ids=["the-file", "a-folder-under-it"])
def test_a_checkpoint_dir_that_is_a_file_is_one_clear_line(tmp_path: Path, under: bool) -> None:
    """As hydra.run.dir's: it ended in the raw errno of the probe written there ("[Errno 17] File exists")."""
    (tmp_path / "taken").write_text("a file where the folder would go")
    folder = tmp_path / "taken" / "sub" if under else tmp_path / "taken"
    proc = run_app([*FAST, f"hydra.run.dir={tmp_path / 'run'}", f"train.checkpoint_dir={folder}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"error: train.checkpoint_dir={folder}: {tmp_path / 'taken'} is a file, not a "
                                   "folder. Set train.checkpoint_dir to a folder")


@pytest.mark.parametrize("argv,message", [
    (["optimizer.lr=1e-4,3e-4"], "error: optimizer.lr=1e-4,3e-4 gives several values, and a single run takes one: add "
                                 "-m to sweep them, a job per value (python train.py -m experiment=quickstart "
                                 "optimizer.lr=1e-4,3e-4), or give one value"),
    (["-m", "optimizer.lr=interval(1e-4,1e-3)"],
     "error: optimizer.lr=interval(1e-4,1e-3) is a range for a search to draw from, and this sweep runs a list of "
     "jobs: search it with Optuna"),
], ids=["values-without-m", "interval-without-a-search"])
def test_values_for_a_sweep_or_a_search_where_none_takes_them_are_named(argv: List[str], message: str,
                                                                         tmp_path: Path) -> None:
    """Hydra's parser spoke of lists and quotes ("Ambiguous value"), and its basic sweeper ended in a traceback."""
    flags = [arg for arg in argv if arg == "-m"]
    proc = run_app([*flags, "experiment=quickstart", *(arg for arg in argv if arg != "-m")], cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith(message) and "Traceback" not in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []  # no outputs/ or multirun/ where the command ran


def test_an_empty_mapping_that_would_change_nothing_is_refused_with_the_way_to_drop_an_entry(tmp_path: Path) -> None:
    """'task.eval_splits={}' (meant: evaluate nothing) was merged as no change, and the run evaluated as before."""
    proc = run_app(["task=rte", "task.eval_splits={}", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith(
        "error: task.eval_splits={} changes nothing: Hydra merges a mapping given on the command line into the "
        "config's, and task.eval_splits keeps validation. Drop an entry with ~task.eval_splits.validation"), proc.stderr
    assert not (tmp_path / "run").exists()
    dropped = run_app(["task=rte", "~task.eval_splits.validation"], cwd=tmp_path)  # the way it names: the rule
    assert dropped.returncode == 1 and "error: task.eval_splits must name at least one split" in dropped.stderr


@pytest.mark.parametrize("sweep", [False, True])
def test_an_empty_folder_setting_is_refused_not_the_current_directory(sweep: bool, tmp_path: Path) -> None:
    """``hydra.run.dir=$RUN`` with RUN unset: Hydra took it as the current directory and wrote the run there."""
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    proc = run_app([*(["-m"] if sweep else []), *FAST, f"{key}="], cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.startswith(f"error: {key} is empty (an unset shell variable?)")
    assert list(tmp_path.iterdir()) == []  # nothing written where the command ran


def test_a_sweep_into_a_runs_folder_and_a_run_into_a_sweeps_are_refused(
        tmp_path: Path, shared_run: Callable[[str, Sequence[str]], Path]) -> None:
    run = shared_run("fast", FAST)
    before = sorted(path.relative_to(run) for path in run.rglob("*"))
    proc = run_app(["-m", *FAST, "seed=1,2", f"hydra.sweep.dir={run}"], cwd=tmp_path)
    assert proc.returncode == 1 and f"error: hydra.sweep.dir={run} is a run's folder" in proc.stderr, proc.stderr
    assert sorted(path.relative_to(run) for path in run.rglob("*")) == before
    started = tmp_path / "started"  # a run still in its first steps: its config.yaml, no results yet
    started.mkdir()
    shutil.copy(run / "config.yaml", started / "config.yaml")
    proc = run_app(["-m", *FAST, "seed=1,2", f"hydra.sweep.dir={started}"], cwd=tmp_path)
    assert proc.returncode == 1 and f"error: hydra.sweep.dir={started} is a run's folder" in proc.stderr, proc.stderr
    loading = tmp_path / "loading"  # a run loading its data: its claim and log, its record not yet written
    loading.mkdir()
    shutil.copy(run / "train.log", loading / "train.log")
    (loading / CLAIM_FILE).write_text("{}")
    proc = run_app(["-m", *FAST, "seed=1,2", f"hydra.sweep.dir={loading}"], cwd=tmp_path)
    assert proc.returncode == 1 and f"error: hydra.sweep.dir={loading} is a run's folder" in proc.stderr, proc.stderr
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")  # what Hydra writes first into a sweep's folder
    proc = run_app([*FAST, f"hydra.run.dir={sweep}"], cwd=tmp_path)
    assert proc.returncode == 1 and f"error: hydra.run.dir={sweep} is a sweep's folder" in proc.stderr, proc.stderr
    proc = run_app([*FAST, f"output_dir={sweep}"], cwd=tmp_path)  # a local output_dir is the run's Hydra directory
    assert proc.returncode == 1 and f"error: output_dir={sweep} is a sweep's folder" in proc.stderr, proc.stderr
    assert [path.name for path in sweep.iterdir()] == ["multirun.yaml"]


@pytest.mark.parametrize("argv", [
    ["experiment=quickstart", "+data.files.train=a.csv", "+data.files.validation=b.csv", "+data.columns.label=y"],
    ["task=rte", "+task.glue.columns.extra=Extra"],
    ["-m", "hydra/launcher=vertex", "+hydra.launcher.env.MY_VAR=1", "+hydra.job.env_set.OTHER=2"],  # a sweep's: -m
])
def test_free_form_mappings_take_new_keys(argv: List[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("a.csv", "b.csv"):  # the files data.files names are looked for (nli.config.paths)
        (tmp_path / name).write_text("premise,hypothesis,y\n")
    check(argv, CONF, "train")  # no SystemExit: these mappings are meant to take keys of the user's


def _typed_nodes(node: DictConfig, prefix: str = "") -> Iterator[Tuple[str, List[str]]]:
    """Every node of the config typed by a schema, with its fields."""
    known = fields_of(node)
    if known is not None and prefix:
        yield prefix[:-1], known
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            yield from _typed_nodes(child, f"{prefix}{key}.")


# Options that give every optional node keys: adapters, a model from scratch, every logger, GLUE files.
EVERY_NODE = [["experiment=quickstart", "model/peft=lora", "logger=[csv,wandb,tensorboard]"], ["task=rte"]]


@pytest.mark.parametrize("options", EVERY_NODE)
def test_every_node_of_the_schema_refuses_an_unknown_key(options: List[str]) -> None:
    nodes = dict(_typed_nodes(compose_config(options)))
    assert {"model", "task", "optimizer", "schedule", "precision", "hw", "data", "train", "eval",
            "train.early_stopping"} <= set(nodes)
    for path, known in nodes.items():
        misspelt = f"{known[-1]}x"
        with pytest.raises(ConfigError, match=rf"^{path}\.{misspelt} is not a key of this config: did you mean "
                                              rf"{path}\.{known[-1]}\b"):
            check_known(compose_config([*options, f"++{path}.{misspelt}=1"]))
    assert dataclasses.is_dataclass(OmegaConf.get_type(compose_config(options)))  # the root too
    with pytest.raises(ConfigError, match="^nonsense is not a key of this config"):
        check_known(compose_config([*options, "+nonsense=1"]))


@pytest.mark.parametrize("typed,said", [
    # The shell splits an unquoted path with a space: Hydra's parser said "missing EQUAL at '<EOF>'".
    (["experiment=quickstart", "hydra.run.dir=my", "runs/x"],
     "error: runs/x is not an override (key=value): if it is the rest of hydra.run.dir=my (a value with a space), "
     "quote the two as one: 'hydra.run.dir=my runs/x'\n"),
    (["runs/x", "experiment=quickstart"],
     "error: runs/x is not an override (key=value): python train.py --help lists the keys\n"),
    # A ~ the shell left (quoted, or not at a word's start): Hydra's parser pointed at it with a caret.
    (["experiment=quickstart", "data.dir=~/glue"],
     f"error: data.dir=~/glue: Hydra does not read ~ in a value, nor expand it: write the path in full: "
     f"data.dir={os.path.expanduser('~/glue')}\n"),
    (["experiment=quickstart", "train.max_steps=[1"],
     "error: train.max_steps=[1: no viable alternative at input '[1' (quote a value with spaces or special "
     "characters: train.max_steps='[1'; Hydra's override grammar: "
     "https://hydra.cc/docs/1.2/advanced/override_grammar/basic)\n"),
], ids=["space", "no-equals", "tilde", "grammar"])
def test_an_argument_hydra_cannot_parse_is_named_with_its_fix(tmp_path: Path, typed: List[str], said: str) -> None:
    proc = run_app(typed, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr == said and not list(tmp_path.iterdir())


def test_cfg_job_checks_the_keys_as_a_run_does_and_prints_the_config(tmp_path: Path) -> None:
    """``--cfg job`` was left to Hydra: a misspelt key got "To append to your config use +train.epocs=3", the form
    this project refuses."""
    proc = run_app(["--cfg", "job", "experiment=quickstart", "train.epocs=3"], cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: train.epocs is not a key of this config: did you mean train.epochs?")
    assert "+train.epocs" not in proc.stderr
    shown = run_app(["--cfg=job", "experiment=quickstart", "train.epochs=3", "optimizer.lr=-1"], cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr  # what it shows is the config: the schema's rules are the run's
    assert "  epochs: 3.0\n" in shown.stdout and "  lr: -1.0\n" in shown.stdout
    assert not list(tmp_path.iterdir())


def test_a_sweep_asked_for_its_config_is_told_how_to_see_one_jobs(tmp_path: Path) -> None:
    """``-m ... --cfg job`` was Hydra's ValueError with its traceback; it is one line giving one job's command."""
    proc = run_app(["-m", "experiment=quickstart", "seed=1,2", "data.dir=/a b", "--cfg", "job"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and not list(tmp_path.iterdir())
    assert proc.stderr == ("error: -m runs a sweep and --cfg shows a config, one or the other: to see a job's config, "
                           "drop -m and give that job's values (python train.py --cfg job experiment=quickstart seed=1 "
                           "'data.dir=/a b')\n")
    shown = run_app(["--cfg", "job", "experiment=quickstart", "seed=1", "data.dir=/a b"], cwd=tmp_path)
    assert shown.returncode == 0 and "seed: 1\n" in shown.stdout, shown.stderr  # the command given works


def test_shell_completion_without_its_subcommand_says_what_to_type(tmp_path: Path) -> None:
    """``--shell-completion`` alone was Hydra's ValueError with its traceback; it is one line, and the command it
    gives prints bash's completion script."""
    proc = run_app(["--shell-completion"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and not list(tmp_path.iterdir())
    assert proc.stderr == ("error: --shell-completion needs one of install=SHELL, uninstall=SHELL or query=SHELL: to "
                           'complete this command in bash, eval "$(python train.py -sc install=bash)"\n')
    script = run_app(["-sc", "install=bash"], cwd=tmp_path)
    assert script.returncode == 0 and "hydra_bash_completion()" in script.stdout, script.stderr


@pytest.mark.parametrize("argv", [["logger=[csv,tensorbord]"], ["logger=[csv,tensorbord]", "--cfg", "job"],
                                  ["-m", "logger=[csv,tensorbord]", "seed=1,2"]])
def test_a_misspelt_option_in_a_list_of_a_group_is_named_with_the_groups_options(argv: List[str]) -> None:
    """Hydra says only "Could not load 'logger/tensorbord'" of an option in a list, as of a broken file, where it
    lists the group's options for one given alone."""
    with pytest.raises(SystemExit, match=r"^error: logger has no option tensorbord \(did you mean tensorboard\?\): "
                                         r"its options are csv, none, tensorboard, wandb$"):
        check(["experiment=quickstart", *argv], CONF, "train")


def test_a_value_the_launcher_refuses_is_named_as_the_sweeps_not_as_every_jobs() -> None:
    """A launcher's setting is the sweep's: its refusal said "every job of the sweep would stop as it starts ...
    drop it from the sweep", where nothing was swept."""
    with pytest.raises(SystemExit, match=r"^error: hydra.launcher.strategy=spot: Invalid value 'spot', expected one "
                                         r"of \[STANDARD, SPOT, FLEX_START\]$"):
        check(["-m", "hydra/launcher=vertex", "experiment=quickstart", "hydra.launcher.strategy=spot", "seed=1,2"],
              CONF, "train")


def test_a_sweep_of_evaluations_is_checked_with_its_run_folders_config_taken_in(
        shared_run: Callable[[str, Sequence[str]], Path], tmp_path: Path) -> None:
    """A job that evaluates (eval.only) was left to check itself as it started, so that a path that is no run
    folder under an experiment that builds its model from scratch (quickstart's model.scratch), or a value the
    rules refuse, failed every job of the sweep after its start (a Slurm queue, a Vertex AI machine). Each job is
    checked with its run folder's config taken in, as it will take it, and passes where it will."""
    trained = shared_run("fast", FAST)
    sweep = f"hydra.sweep.dir={tmp_path / 'sweep'}"
    assert check(["-m", "eval.only=true", f"model.name_or_path={trained}", "train.eval_batch_size=8,16", sweep],
                 CONF, "train").extra == []
    with pytest.raises(SystemExit) as batch:
        check(["-m", "eval.only=true", f"model.name_or_path={trained}", "train.eval_batch_size=8,0", sweep],
              CONF, "train")
    assert str(batch.value).startswith("error: the sweep's job train.eval_batch_size=0 would stop as it starts: "
                                       "train.eval_batch_size=0 must be positive")
    with pytest.raises(SystemExit) as nowhere:
        check(["-m", "experiment=quickstart", "eval.only=true", f"model.name_or_path={tmp_path / 'none'}",
               "seed=1,2", sweep], CONF, "train")
    assert str(nowhere.value).startswith("error: every job of the sweep would stop as it starts: set exactly one of "
                                         "model.name_or_path (a pretrained checkpoint) and model.scratch")
