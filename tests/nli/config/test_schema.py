"""Every config file composes, and wrong values fail early with a message naming the key."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, List, Sequence, Set

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ValidationError

import nli.config.schema
from nli.config.help import field_descriptions
from nli.config.schema import AdamConfig, Config, CsvConfig, SGDConfig, TensorBoardConfig, WandbConfig
from nli.contract import job_needs
from nli.errors import ConfigError
from tests.conftest import build_config, compose_config
from tests.support.runs import CONF, FAST, GLUE_DATA, ROOT, run_app, run_process

# Every option of every group of the run's config, nested ones (model/peft) included; not Hydra's own
# (hydra/launcher's presets, typed by their launchers: tests/clouds/test_vertex_day_one.py, test_local_gpus.py).
GROUP_OPTIONS = sorted((p.parent.relative_to(CONF).as_posix(), p.stem) for p in CONF.rglob("*.yaml")
                       if p.parent != CONF and p.relative_to(CONF).parts[0] != "hydra")


def options(group: str) -> list[str]:
    return [name for g, name in GROUP_OPTIONS if g == group]


@pytest.mark.parametrize("group,name", GROUP_OPTIONS)
def test_every_yaml_composes_into_its_schema(group: str, name: str) -> None:
    cfg = build_config([f"{group}={name}"])
    assert isinstance(cfg, Config)
    if group in ("experiment", "hparams_search"):  # global: they set keys of other groups (and of hydra)
        return
    node: object = cfg
    for key in group.split("/"):  # model/peft: cfg.model.peft
        node = getattr(node, key)
    if (group, name) == ("model/peft", "none"):  # no adapters: full fine-tuning
        assert node is None
        return
    nodes = list(cfg.logger.values()) if group == "logger" else [node]  # loggers: one key each
    for node in nodes:
        assert type(node).__name__.endswith("Config"), f"{group}/{name}.yaml is not typed by a schema"


@pytest.mark.parametrize("group,name", GROUP_OPTIONS)
def test_a_run_from_python_records_the_config_the_command_line_records(group: str, name: str) -> None:
    """A run started from Python gets its resolved config from the typed config (nli.runtime.context.local); the
    command line from Hydra's. The two are the same, key for key and in the same order, for every file: the
    same identity (nli.config.identity), config.yaml and loggers' config."""
    from omegaconf import OmegaConf

    from nli.runtime.context import resolved

    raw = compose_config([f"{group}={name}"])
    from_hydra = OmegaConf.to_container(raw, resolve=True, enum_to_str=True)
    ours = resolved(OmegaConf.to_object(raw))
    assert json.dumps(ours) == json.dumps(from_hydra)


@pytest.mark.parametrize("name", options("hparams_search"))
def test_every_search_searches_keys_the_config_has(name: str) -> None:
    from hydra import compose

    sweeper = compose("train", overrides=[f"hparams_search={name}"], return_hydra_config=True).hydra.sweeper
    plain = compose_config([])
    assert set(sweeper.params) == {"optimizer.lr", "train.batch_size", "schedule.warmup_ratio",
                                   "optimizer.weight_decay"}
    assert all(OmegaConf.select(plain, key) is not None for key in sweeper.params)  # a misspelt key would be None
    raw = OmegaConf.to_container(sweeper, resolve=False)  # the study's name resolves only inside a run
    assert raw["direction"] == "maximize" and raw["storage"] == "sqlite:///${hydra.sweep.dir}/optuna.db"


def test_groups_are_the_ones_the_readme_promises() -> None:
    assert set(options("model")) == {
        "roberta-base", "roberta-large", "bert-base", "bert-large", "distilroberta", "tiny", "deberta-v3-xsmall",
        "deberta-v3-small", "deberta-v3-base", "deberta-v3-large", "electra-base", "electra-large", "modernbert-base",
        "modernbert-large", "roberta-large-mnli", "deberta-v3-base-mnli"}
    assert {"mnli", "synthetic"} <= set(options("task"))
    assert set(options("optimizer")) == {"adamw", "adam", "sgd"}
    assert set(options("schedule")) == {"linear", "cosine", "constant"}
    assert set(options("precision")) == {"auto", "fp32", "fp16", "bf16"}
    assert set(options("hw")) == {"auto", "cpu", "t4", "v100", "a100", "h100", "2xv100", "8xa100", "2x8xa100",
                                  "4x8xh100", "tpu-v5e-1", "tpu-v5e-8", "tpu-v3-8", "tpu-v2-8"}
    assert set(options("logger")) == {"none", "wandb", "tensorboard", "csv"}
    assert set(options("model/peft")) == {"none", "lora"}
    assert {"quickstart", "roberta-large-mnli"} <= set(options("experiment"))
    assert set(options("hparams_search")) == {"quickstart", "glue"}


def test_defaults() -> None:
    cfg = build_config([])
    assert cfg.model.name_or_path == "FacebookAI/roberta-base"
    assert cfg.task.name == "mnli" and cfg.task.eval_splits == {"validation_matched": "",
                                                                "validation_mismatched": "_mm"}
    assert isinstance(cfg.optimizer, AdamConfig) and cfg.optimizer._target_ == "torch.optim.AdamW"
    assert cfg.schedule._target_ == "nli.optim.linear" and cfg.precision.dtype.value == "auto"
    assert cfg.hw.accelerator.value == "auto" and list(cfg.logger) == ["csv"]  # metrics.csv, for nli.sweep.report
    assert cfg.output_dir is None and cfg.train.checkpoint_dir is None  # the platform's, else Hydra's run dir
    assert cfg.train.early_stopping.patience is None  # off


def test_optimizer_and_logger_groups_pick_their_own_schema() -> None:
    assert isinstance(build_config(["optimizer=sgd"]).optimizer, SGDConfig)
    assert isinstance(build_config(["logger=wandb"]).logger["wandb"], WandbConfig)
    assert isinstance(build_config(["logger=tensorboard"]).logger["tensorboard"], TensorBoardConfig)
    both = build_config(["logger=[wandb,tensorboard,csv]", "logger.wandb.mode=offline"]).logger
    assert [type(cfg) for cfg in both.values()] == [WandbConfig, TensorBoardConfig, CsvConfig]
    assert both["wandb"].mode.value == "offline" and both["csv"]._target_ == "nli.tracking.CsvTracker"


@pytest.mark.parametrize("overrides,message", [
    (["logger=wandb", "+logger.mode=offline"], "logger.mode='offline' is not a logger: each logger has its own key, "
                                               "e.g. logger=wandb logger.wandb.mode=offline"),
    (["train.early_stopping.patience=0"], "train.early_stopping.patience=0 must be at least 1"),
    (["train.early_stopping.patience=2", "train.early_stopping.min_delta=-1"],
     "train.early_stopping.min_delta=-1.0 must be >= 0"),
])
def test_logger_and_early_stopping_values_are_checked(overrides: List[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config(overrides)


def test_roberta_paper_recipe() -> None:
    cfg = build_config(["experiment=roberta-large-mnli"])
    assert cfg.model.name_or_path == "FacebookAI/roberta-large" and cfg.task.name == "mnli"
    assert cfg.optimizer.lr == 1e-5 and cfg.optimizer.weight_decay == 0.1
    assert cfg.train.batch_size == 32 and cfg.train.epochs == 10
    assert cfg.schedule.warmup_ratio == 0.06


# Which hardware cannot run which precision: the rest must compose.
UNSUPPORTED = {("bf16", "t4"), ("bf16", "v100"), ("bf16", "2xv100")}


# (The model plays no part in these rules; every model file composes in the test above.)
@pytest.mark.parametrize("precision,hw", itertools.product(options("precision"), options("hw")))
def test_precision_hw_matrix(precision: str, hw: str) -> None:
    overrides = [f"precision={precision}", f"hw={hw}"]
    if (precision, hw) in UNSUPPORTED:
        with pytest.raises(ConfigError, match=f"precision={precision} needs a GPU"):
            build_config(overrides)
        return
    cfg = build_config(overrides)
    # The global batch is the same on every machine; accumulation makes up the difference.
    devices = cfg.hw.data_parallel_size
    assert cfg.micro_batch_size(devices) * devices * cfg.accumulation_steps(devices) == cfg.train.batch_size


def test_hw_profiles_carry_what_vertex_needs() -> None:
    """The launcher reads a job's machines through nli.contract, never the hw keys themselves."""
    v100 = job_needs(compose_config(["hw=v100"]))
    assert (v100.machine_type, v100.accelerator_type, v100.accelerators_per_node, v100.nodes) == (
        "n1-standard-8", "NVIDIA_TESLA_V100", 1, 1)
    a100x8 = job_needs(compose_config(["hw=2x8xa100"]))
    assert (a100x8.machine_type, a100x8.accelerator_type, a100x8.accelerators_per_node, a100x8.nodes) == (
        "a2-highgpu-8g", "NVIDIA_TESLA_A100", 8, 2)
    cpu = job_needs(compose_config(["hw=auto"]))
    assert (cpu.machine_type, cpu.accelerator_type, cpu.accelerators_per_node) == (None, None, 0)
    assert job_needs(compose_config(["logger=wandb"])).secrets == {"WANDB_API_KEY"}
    assert not job_needs(compose_config(["logger=[wandb,csv]", "logger.wandb.mode=offline"])).secrets
    # logger.wandb.mode unset: online in the job, unless the launcher hands the job a WANDB_MODE of its own.
    assert job_needs(OmegaConf.create({"logger": {"wandb": {"mode": None}}})).secrets == {"WANDB_API_KEY"}
    offline = {"logger": {"wandb": {"mode": None}}, "hydra": {"launcher": {"env": {"WANDB_MODE": "offline"}}}}
    assert not job_needs(OmegaConf.create(offline)).secrets


def test_accumulation_keeps_the_global_batch() -> None:
    cfg = build_config(["hw=v100", "train.batch_size=64"])  # 16 examples fit on a V100
    assert (cfg.micro_batch_size(1), cfg.accumulation_steps(1)) == (16, 4)
    cfg = build_config(["hw=8xa100", "train.batch_size=32"])
    assert (cfg.micro_batch_size(8), cfg.accumulation_steps(8)) == (4, 1)
    assert (cfg.micro_batch_size(1), cfg.accumulation_steps(1)) == (32, 1)


def test_warmup_ratio_or_steps() -> None:
    assert build_config(["schedule.warmup_ratio=0.1"]).schedule.num_warmup_steps(1000) == 100
    assert build_config(["schedule.warmup_steps=7"]).schedule.num_warmup_steps(1000) == 7


@pytest.mark.parametrize("override,message", [
    ("optimizer.lr=-1", "optimizer.lr=-1.0 must be positive"),
    ("train.batch_size=0", "train.batch_size=0 must be positive"),
    ("hw=v100 train.batch_size=24", "train.batch_size=24 must be a multiple of hw.per_device_batch_size=16"),
    # The preset's per-device batch was named as the batch's share of each device, and a batch smaller than the
    # devices was told to change a value that could not fix it.
    ("hw=2xv100 train.batch_size=1", "train.batch_size=1 is smaller than the 2 devices the run is on (each device "
                                     "takes at least one example a step): set train.batch_size to a multiple of 2"),
    ("hw=4x8xh100 train.batch_size=48", "train.batch_size=48 must be a multiple of 1 example(s) per device (the "
                                        "batch's share; hw.per_device_batch_size=32 is the most) x 32 device(s)"),
    ("hw=2x8xa100 hw.nodes=0", "hw.nodes=0 must be at least 1"),
    ("hw.cpu_threads=0", "hw.cpu_threads=0 must be at least 1, or null for this run's share of the cores"),
    ("hw.cpu_mmap_threshold=-1", "hw.cpu_mmap_threshold=-1 must be in [0, 33554432] bytes"),
    ("data.fraction_of_train_data=1.5", "data.fraction_of_train_data=1.5 must be in (0, 1]"),
    ("schedule.warmup_ratio=1", "schedule.warmup_ratio=1.0 must be in [0, 1)"),
    ("task.metrics=[accuracy,bleu]", "task.metrics has unknown ['bleu']"),
    ("model=tiny data.max_seq_length=512", "model.scratch.max_position_embeddings=258 must be at least"),
    ("model=tiny model.scratch.model_type=bert data.max_seq_length=300",
     "model.scratch.max_position_embeddings=258 must be at least data.max_seq_length = 300"),
    # Values that would leave an epoch empty, stop the loop advancing, or divide by zero.
    ("data.bucket=-1", "data.bucket=-1 must be >= 0"),
    ("data.num_workers=-1", "data.num_workers=-1 must be >= 0"),
    ("data.synthetic_train_size=0", "data.synthetic_train_size=0 must be at least 1"),
    ("data.synthetic_eval_size=0", "data.synthetic_eval_size=0 must be at least 1"),
    ("data.synthetic_version=3", "data.synthetic_version=3: the synthetic task has versions 1 (the task until"),
    ("data.max_train_samples=0", "data.max_train_samples=0 must be positive or null"),
    ("data.max_eval_samples=0", "data.max_eval_samples=0 must be positive or null"),
    ("data.max_seq_length=4", "data.max_seq_length=4 must be >= 8"),
    ("train.eval_batch_size=0", "train.eval_batch_size=0 must be positive"),
    ("train.epochs=0", "train.epochs=0.0 must be positive"),
    ("train.epochs=inf", "train.epochs=inf must be a finite number of passes; to train for a number of steps "
                         "instead, set train.max_steps"),
    ("train.max_steps=0", "train.max_steps=0 must be positive or null"),
    ("train.eval_every=0", "train.eval_every=0 must be positive or null"),
    ("train.log_every=0", "train.log_every=0 must be positive"),
    ("train.checkpoint_every=-5", "train.checkpoint_every=-5 must be positive"),
    ("train.keep_checkpoints=0", "train.keep_checkpoints=0 must be >= 1"),
    ("model=tiny model.scratch.num_attention_heads=0", "model.scratch.num_attention_heads=0 must be at least 1"),
    # NumPy's seed range.
    ("seed=-1", "seed=-1 must be between 0 and 2**32 - 1 = 4294967295"),
    (f"seed={2**32}", "seed=4294967296 must be between 0 and 2**32 - 1 = 4294967295"),
    # Dropout is a probability; a scratch model has its own.
    ("model.dropout=1.5", "model.dropout=1.5 must be in [0, 1)"),
    ("model.dropout=-0.1", "model.dropout=-0.1 must be in [0, 1)"),
    ("model=tiny model.scratch.dropout=1.5", "model.scratch.dropout=1.5 must be in [0, 1)"),
    ("model=tiny model.dropout=0.2", "model.dropout=0.2 sets a pretrained checkpoint's dropout, and this model is "
                                     "built from scratch (model.scratch): set model.scratch.dropout=0.2 instead"),
    # Metrics that do not fit the task's labels: they failed at the first evaluation, after training had run.
    ("task=mnli task.metrics=[accuracy,f1]", "task.metrics=['accuracy', 'f1']: ['f1'] is the F1 of label 1 against "
                                             "the other, and task=mnli has 3 labels: use accuracy or"),
    ("task=rte task.metrics=[pearson] task.main_metric=pearson",
     "['pearson'] correlate scores, and task=rte has labels"),
    ("task=stsb task.metrics=[accuracy] task.main_metric=accuracy", "['accuracy'] compare labels, and task=stsb is a "
                                                                    "regression (no label_names)"),
])
def test_impossible_values_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config(override.split())
    assert message in str(err.value)


def test_the_edges_of_the_ranges_are_accepted() -> None:
    for overrides in (["seed=0"], [f"seed={2**32 - 1}"], ["data.bucket=0", "data.num_workers=0"],
                      ["model.dropout=0"], ["model=tiny", "model.scratch.dropout=0"],
                      ["train.epochs=inf", "train.max_steps=10"],  # max_steps decides; epochs is not used
                      ["model=tiny", "model.scratch.model_type=bert", "data.max_seq_length=258"]):
        build_config(overrides)


def test_typo_and_wrong_type_fail_at_composition() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["train.epocs=3"])
    assert isinstance(err.value.__cause__, ConfigAttributeError) and "train.epocs" in str(err.value.__cause__)
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(["train.batch_size=abc"])
    assert isinstance(err.value.__cause__, ValidationError)
    assert "train.batch_size" in str(err.value.__cause__)


def imported(stderr: str) -> Set[str]:
    """The modules a process imported, from its ``-X importtime`` report."""
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


# RTE's real files, as files of your own.
OWN_RTE = ["task=rte", "model=tiny", "train.max_steps=2", f"+data.files.train={GLUE_DATA}/RTE/train.tsv",
           f"+data.files.validation={GLUE_DATA}/RTE/dev.tsv"]


@pytest.mark.parametrize("args,expected", [
    (["model=robert-base"], ["Could not find 'model/robert-base'", "roberta-base", "roberta-large"]),
    (["train.epocs=3"], ["error: train.epocs is not a key of this config: did you mean train.epochs?"]),
    (["train.batch_size=abc"], ["Value 'abc' of type 'str' could not be converted to Integer",
                                "train.batch_size"]),
    (["experiment=quickstart", "optimizer.lr=-1"], ["optimizer.lr=-1.0 must be positive"]),
    (["experiment=quickstart", "train.batch_size=0"], ["train.batch_size=0 must be positive"]),
    (["experiment=quickstart", "hw=cpu", "hw.per_device_batch_size=12"],
     ["train.batch_size=32 must be a multiple of hw.per_device_batch_size=12"]),
    (["experiment=quickstart", "data.bucket=-1"], ["error: data.bucket=-1 must be >= 0"]),  # it used to hang at step 0
    (["experiment=quickstart", "seed=-1"], ["error: seed=-1 must be between 0 and 2**32 - 1"]),
    (["experiment=quickstart", "model.scratch.dropout=1.5"], ["error: model.scratch.dropout=1.5 must be in [0, 1)"]),
    (["experiment=quickstart", "model.dropout=0.2"], ["error: model.dropout=0.2 sets a pretrained checkpoint's "
                                                      "dropout", "set model.scratch.dropout=0.2 instead"]),
    # A data.columns key that names no column of the task was never read: the run trained on the file's `label`.
    ([*OWN_RTE, "+data.columns.lable=gold"], ["error: data.columns.lable names no column task=rte reads, so nothing "
                                              "would read it: did you mean data.columns.label? data.columns maps "
                                              "sentence1, sentence2, label to the files' columns"]),
    ([*OWN_RTE, "+data.columns.premise=text_a"], ["error: data.columns.premise names no column task=rte reads"]),
    # A data.files key that names no split of the task was never read: the run scored data.files.validation.
    ([*OWN_RTE, f"+data.files.dev={GLUE_DATA}/RTE/dev.tsv"],
     ["error: data.files.dev names no split of task=rte, so no run would read it: did you mean "
      "data.files.validation? data.files takes train, validation, test"]),
    ([*OWN_RTE, f"+data.files.tset={GLUE_DATA}/RTE/test.tsv"],
     ["error: data.files.tset names no split of task=rte, so no run would read it: did you mean data.files.test?"]),
])
def test_bad_input_on_the_command_line(tmp_path: Path, args: list[str], expected: list[str]) -> None:
    """What a user sees: a non-zero exit and the key, and nothing written."""
    proc = run_app([*args, f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1
    for text in expected:
        assert text in output
    assert not (tmp_path / "run" / "model").exists() and not (tmp_path / "run" / "results.json").exists()
    assert "Traceback" not in output


@pytest.mark.process
@pytest.mark.parametrize("args", [["train.epocs=3"], ["experiment=quickstart", "optimizer.lr=-1"]],
                         ids=["composition", "rule"])
def test_bad_input_is_answered_before_torch_loads(tmp_path: Path, args: list[str]) -> None:
    """A refused key or value is answered in about a second: the process never imports torch."""
    proc = run_process([*args, f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "hydra" in imported(proc.stderr) and not {"torch", "transformers", "datasets"} & imported(proc.stderr)


def without_descriptions(help_text: str) -> str:
    """The help with the config's ``# ...`` descriptions taken out: Hydra's text, where ours adds them."""
    lines = [re.sub(r" +# .*$", "", line) for line in help_text.splitlines(keepends=False)
             if not re.match(r" *# ", line)]
    return "".join(line + "\n" for line in lines)


@pytest.mark.process
@pytest.mark.parametrize("overrides", [[], ["model=tiny", "optimizer.lr=0.5"]], ids=["defaults", "overrides"])
def test_help_describes_every_key_without_torch(tmp_path: Path, overrides: List[str]) -> None:
    """`--help` (nli/config/help.py) prints Hydra's help, less the internal schema/ groups, with each key's
    description from the schema after it as a YAML comment, in a second, without importing torch;
    `--config-name` is a flag it leaves to Hydra, which gives Hydra's own text."""
    env = {"PYTHONPROFILEIMPORTTIME": "1", "COLUMNS": "120"}
    ours = run_process(["--help", *overrides], cwd=tmp_path, env=env)
    hydras = run_app(["--help", "--config-name", "train", *overrides], cwd=tmp_path)
    job = run_app(["--cfg", "job", *overrides], cwd=tmp_path)
    assert ours.returncode == 0 and hydras.returncode == 0 and job.returncode == 0, ours.stderr + hydras.stderr
    # The header (conf/train.yaml's hydra.help.header: example commands, with comments of their own) as Hydra
    # prints it; after it, Hydra's template around the config, as Hydra fills it, the config the same YAML.
    header, groups, rest = ours.stdout.partition("== Configuration groups ==")
    assert groups and hydras.stdout.startswith(header) and "Examples:" in header
    help_text = groups + rest
    hydra_text = "".join(line for line in hydras.stdout[len(header):].splitlines(keepends=True)
                         if not line.startswith("schema/"))
    assert job.stdout in hydra_text
    before, after = hydra_text.split(job.stdout)
    plain = without_descriptions(help_text)
    assert plain.startswith(before) and plain.endswith(after)
    config = help_text[len(before):len(help_text) - len(after)]
    assert yaml.safe_load(config) == yaml.safe_load(job.stdout)
    for group, names in {path.name: sorted(p.stem for p in path.glob("*.yaml")) for path in CONF.iterdir()
                         if path.is_dir() and path.name != "hydra"}.items():
        assert f"\n{group}: {', '.join(names)}\n" in help_text

    # Each key with its description on its line, lined up; dict- and list-valued keys on the key's line.
    assert re.search(r"^  lr: \S+ +# peak learning rate$", help_text, re.M)  # AdamConfig's, from OptimizerConfig
    assert re.search(r"^  batch_size: 32 +# global batch: examples per optimizer step", help_text, re.M)
    assert re.search(r"^  betas: +# moment decay rates$", help_text, re.M)
    assert re.search(r"^  fast_paths: true +# faster forward where it applies", help_text, re.M)
    assert re.search(r"^output_dir: null +# results, model and logs \(local or gs://\)", help_text, re.M)  # above
    assert re.search(r"^    min_delta: 0.0 +# rise of the main metric", help_text, re.M)  # train.early_stopping
    assert re.search(r"^seed: 42 +# seeds Python, NumPy and torch$", help_text, re.M)
    columns = {line.index("# ") for line in config.splitlines()
               if re.match(r" *(weight_decay|batch_size|seed): ", line)}
    assert len(columns) == 1
    if overrides:  # model=tiny: from scratch, its architecture a nested block
        assert re.search(r"^  scratch: +# architecture when name_or_path is null$", help_text, re.M)
        assert re.search(r"^    model_type: roberta +# any transformers model type", help_text, re.M)
        assert re.search(r"^    hidden_size: 128 +# width of every layer$", help_text, re.M)
        assert re.search(r"^  lr: 0.5 +# peak learning rate$", help_text, re.M)
    assert "hydra" in imported(ours.stderr) and not {"torch", "transformers", "datasets"} & imported(ours.stderr)


@pytest.mark.process
def test_help_describes_each_logger_of_several(tmp_path: Path) -> None:
    """A node the schema types inside a plain dict (logger.<name>) gets its own descriptions; `python -m nli`."""
    proc = run_process(["--help", "logger=[wandb,tensorboard]", "optimizer=sgd"], cwd=tmp_path, module=True,
                       env={"COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^  wandb:\n    _target_: \S+ +# the logger's class", proc.stdout, re.M)
    assert re.search(r"^    project: null +# W&B project; null: WANDB_PROJECT", proc.stdout, re.M)
    assert re.search(r"^    subdir: tensorboard +# event files go to", proc.stdout, re.M)
    assert re.search(r"^  momentum: 0.9 +# heavy-ball momentum$", proc.stdout, re.M)
    assert re.search(r"^  lr: \S+ +# peak learning rate$", proc.stdout, re.M)  # SGDConfig's, from OptimizerConfig


def test_every_schema_field_has_a_description() -> None:
    """`--help` describes a key with its field's comment in nli/config/schema.py (trailing, or the lines above):
    a field without one would be a key the help leaves unexplained."""
    schemas = [cls for cls in vars(nli.config.schema).values()
               if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == "nli.config.schema"]
    assert schemas
    undescribed = [f"{cls.__name__}.{f.name}" for cls in schemas for f in dataclasses.fields(cls)
                   if f.name not in field_descriptions(cls)]
    assert not undescribed, f"give these fields of nli/config/schema.py a comment: {undescribed}"


@dataclasses.dataclass
class _Commented:
    trailing: int = 1  # after the field
    # above the field,
    # on two lines
    above: int = 2
    both: int = 3  # the trailing one wins
    bare: int = 4

    spaced: int = 5  # noqa: E501


@dataclasses.dataclass
class _Subclass(_Commented):
    trailing: int = 10
    own: List[int] = dataclasses.field(  # across lines
        default_factory=list)


def test_field_descriptions_read_the_source() -> None:
    assert field_descriptions(_Commented) == {"trailing": "after the field", "above": "above the field, on two lines",
                                              "both": "the trailing one wins"}
    assert field_descriptions(_Subclass) == {**field_descriptions(_Commented), "own": "across lines"}
    assert field_descriptions(AdamConfig)["lr"] == "peak learning rate"
    assert field_descriptions(dict) == {}


@pytest.mark.process
def test_cfg_job_prints_the_config_without_torch(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "train.py"), "--cfg", "job", "model=tiny",
                           "train.compile=true"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["model"]["scratch"]["model_type"] == "roberta" and cfg["train"]["compile"] is True
    assert cfg["data"]["bucket"] == 50 and cfg["optimizer"]["fused"] is True and cfg["model"]["attention"] == "sdpa"
    assert "hydra" in imported(proc.stderr) and not {"torch", "transformers", "datasets"} & imported(proc.stderr)


def test_help_with_a_bad_override_is_hydras_error(tmp_path: Path) -> None:
    proc = run_app(["--help", "model=nope"], cwd=tmp_path)
    assert proc.returncode != 0 and "Could not find 'model/nope'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("overrides,message", [
    (["experiment=quickstart", "model.peft.r=16"], "error: model.peft.r=16 sets a key of model.peft, which is null "
     "in this config: select the adapters first: model/peft=lora"),
    (["model.scratch.hidden_size=64"], "error: model.scratch.hidden_size=64 sets a key of model.scratch, which is "
     "null in this config: model.scratch describes a model built from scratch (model=tiny)"),
])
def test_a_key_under_a_null_node_is_named_with_its_fix(tmp_path: Path, overrides: List[str], message: str) -> None:
    # Hydra's own answer was an OmegaConf assertion traceback ("Unexpected type for root: NoneType").
    proc = run_app(overrides, cwd=tmp_path)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.process
def test_python_dash_m_nli_names_a_key_under_a_null_node(tmp_path: Path) -> None:
    proc = run_process(["experiment=quickstart", "model.peft.r=16"], cwd=tmp_path, module=True)
    assert proc.returncode == 1 and "which is null in this config: select the adapters first: model/peft=lora" \
        in proc.stderr and "Traceback" not in proc.stderr


def test_a_key_under_a_node_its_option_fills_composes(tmp_path: Path) -> None:
    proc = run_app(["experiment=quickstart", "model/peft=lora", "model.peft.r=16", "model.scratch.hidden_size=64",
                    "--cfg", "job"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "r: 16" in proc.stdout and "hidden_size: 64" in proc.stdout


def test_a_jobs_refusal_is_the_line_the_job_would_stop_with(
        shared_run: Callable[[str, Sequence[str]], Path], tmp_path: Path) -> None:
    """What a launcher asks before it starts a machine for a job (nli.config.schema.job_refusal): a value or a
    combination the rules refuse, in the job's own words; nothing for a job that passes, for an evaluation of a
    run folder (checked against that folder's config as it starts) or for another app's config. An evaluation of
    anything else is checked as a training run is: it was let through, to fail on the machine started for it."""
    from hydra import compose
    from omegaconf import DictConfig

    from nli.config.schema import job_refusal

    def job(*overrides: str) -> DictConfig:
        return compose("train", overrides=["experiment=quickstart", *overrides], return_hydra_config=True)

    assert job_refusal(job()) is None
    bad = job("optimizer.lr=-1")
    assert job_refusal(bad) == "optimizer.lr=-1.0 must be positive (e.g. optimizer.lr=2e-5)"
    assert "hydra" in bad and bad.optimizer.lr == -1  # the config is left as it was
    with pytest.raises(ConfigError) as batch:
        build_config(["experiment=quickstart", "hw=v100", "train.batch_size=24"])
    assert job_refusal(job("hw=v100", "train.batch_size=24")) == str(batch.value)
    assert job_refusal(job("eval.only=true", "optimizer.lr=-1")) == "optimizer.lr=-1.0 must be positive (e.g. " \
        "optimizer.lr=2e-5)"
    assert job_refusal(job("eval.only=true", f"model.name_or_path={tmp_path}")).startswith(
        "set exactly one of model.name_or_path (a pretrained checkpoint) and model.scratch")
    trained = shared_run("fast", FAST)
    assert job_refusal(compose("train", overrides=["eval.only=true", f"model.name_or_path={trained}"],
                               return_hydra_config=True)) is None
    assert job_refusal(OmegaConf.create({"optimizer": {"lr": -1}})) is None
