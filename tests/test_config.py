"""Every config file composes, and wrong values fail early with a message naming the key."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from typing import List, Set
from pathlib import Path

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ValidationError

from nli.config import AdamConfig, Config, ConfigError, SGDConfig, TensorBoardConfig, WandbConfig
from tests.conftest import CONF, ROOT, build_config, compose_config, run_train

GROUP_OPTIONS = sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml"))


def options(group: str) -> list[str]:
    return [name for g, name in GROUP_OPTIONS if g == group]


@pytest.mark.parametrize("group,name", GROUP_OPTIONS)
def test_every_yaml_composes_into_its_schema(group: str, name: str) -> None:
    cfg = build_config([f"{group}={name}"])
    assert isinstance(cfg, Config)
    if group == "experiment":
        return
    node = getattr(cfg, group)
    assert type(node).__name__.endswith("Config"), f"{group}/{name}.yaml is not typed by a schema"


def test_groups_are_the_ones_the_readme_promises() -> None:
    assert set(options("model")) == {"roberta-base", "roberta-large", "bert-base", "bert-large",
                                     "distilroberta", "tiny"}
    assert {"mnli", "synthetic"} <= set(options("task"))
    assert set(options("optimizer")) == {"adamw", "adam", "sgd"}
    assert set(options("schedule")) == {"linear", "cosine", "constant"}
    assert set(options("precision")) == {"auto", "fp32", "fp16", "bf16"}
    assert set(options("hw")) == {"auto", "cpu", "k80", "t4", "v100", "a100", "h100", "2xv100", "8xa100", "2x8xa100",
                                  "4x8xh100"}
    assert set(options("logger")) == {"none", "wandb", "tensorboard"}
    assert {"quickstart", "roberta-large-mnli"} <= set(options("experiment"))


def test_defaults() -> None:
    cfg = build_config([])
    assert cfg.model.name_or_path == "FacebookAI/roberta-base"
    assert cfg.task.name == "mnli" and cfg.task.eval_splits == {"validation_matched": "",
                                                                "validation_mismatched": "_mm"}
    assert isinstance(cfg.optimizer, AdamConfig) and cfg.optimizer._target_ == "torch.optim.AdamW"
    assert cfg.schedule.name.value == "linear" and cfg.precision.dtype.value == "auto"
    assert cfg.hw.accelerator.value == "auto" and cfg.logger.kind == "none"


def test_optimizer_and_logger_groups_pick_their_own_schema() -> None:
    assert isinstance(build_config(["optimizer=sgd"]).optimizer, SGDConfig)
    assert isinstance(build_config(["logger=wandb"]).logger, WandbConfig)
    assert isinstance(build_config(["logger=tensorboard"]).logger, TensorBoardConfig)


def test_roberta_paper_recipe() -> None:
    cfg = build_config(["experiment=roberta-large-mnli"])
    assert cfg.model.name_or_path == "FacebookAI/roberta-large" and cfg.task.name == "mnli"
    assert cfg.optimizer.lr == 1e-5 and cfg.optimizer.weight_decay == 0.1
    assert cfg.train.batch_size == 32 and cfg.train.epochs == 10
    assert cfg.schedule.warmup_ratio == 0.06


# Which hardware cannot run which precision: the rest must compose.
UNSUPPORTED = {("bf16", "k80"), ("bf16", "t4"), ("bf16", "v100"), ("bf16", "2xv100"), ("fp16", "k80")}


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
    v100 = build_config(["hw=v100"]).hw
    assert (v100.machine_type, v100.accelerator_type, v100.gpus_per_node) == (
        "n1-standard-8", "NVIDIA_TESLA_V100", 1)
    a100x8 = build_config(["hw=8xa100"]).hw
    assert (a100x8.machine_type, a100x8.accelerator_type, a100x8.gpus_per_node) == (
        "a2-highgpu-8g", "NVIDIA_TESLA_A100", 8)


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
    ("hw=2x8xa100 hw.nodes=0", "hw.nodes=0 must be at least 1"),
    ("data.fraction_of_train_data=1.5", "data.fraction_of_train_data=1.5 must be in (0, 1]"),
    ("schedule.warmup_ratio=1", "schedule.warmup_ratio=1.0 must be in [0, 1)"),
    ("task.metrics=[accuracy,bleu]", "task.metrics has unknown ['bleu']"),
    ("model=tiny data.max_seq_length=512", "model.scratch.max_position_embeddings=258 must be at least"),
])
def test_impossible_values_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config(override.split())
    assert message in str(err.value)


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


@pytest.mark.parametrize("args,expected", [
    (["model=robert-base"], ["Could not find 'model/robert-base'", "roberta-base", "roberta-large"]),
    (["train.epocs=3"], ["Key 'epocs' not in 'TrainConfig'", "train.epocs"]),
    (["train.batch_size=abc"], ["Value 'abc' of type 'str' could not be converted to Integer",
                                "train.batch_size"]),
    (["experiment=quickstart", "optimizer.lr=-1"], ["optimizer.lr=-1.0 must be positive"]),
    (["experiment=quickstart", "train.batch_size=0"], ["train.batch_size=0 must be positive"]),
    (["experiment=quickstart", "hw=cpu", "hw.per_device_batch_size=12"],
     ["train.batch_size=32 must be a multiple of hw.per_device_batch_size=12"]),
])
def test_bad_input_on_the_command_line(tmp_path: Path, args: list[str], expected: list[str]) -> None:
    """What a user sees: a non-zero exit and the key, before torch loads (so in about a second)."""
    proc = run_train([*args, f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, timeout=120,
                     env={"PYTHONPROFILEIMPORTTIME": "1"})
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for text in expected:
        assert text in output
    assert not (tmp_path / "run" / "model").exists()
    assert "Traceback" not in output
    assert "hydra" in imported(proc.stderr) and not {"torch", "transformers", "datasets"} & imported(proc.stderr)


@pytest.mark.parametrize("overrides", [[], ["model=tiny", "optimizer.lr=0.5"]], ids=["defaults", "overrides"])
def test_help_is_hydras_without_torch(tmp_path: Path, overrides: List[str]) -> None:
    """`--help` (nli/cli.py) prints what Hydra's own help prints, less the internal schema/ groups, without
    importing torch; `--config-name` is a flag it leaves to Hydra, which gives Hydra's own text."""
    ours = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "train.py"), "--help", *overrides],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    hydras = run_train(["--help", "--config-name", "train", *overrides], cwd=tmp_path, timeout=60)
    assert ours.returncode == 0 and hydras.returncode == 0, ours.stderr + hydras.stderr
    assert ours.stdout == "".join(line for line in hydras.stdout.splitlines(keepends=True)
                                  if not line.startswith("schema/"))
    for group in ("model:", "task:", "optimizer:", "schedule:", "precision:", "hw:", "logger:", "experiment:"):
        assert f"\n{group} " in ours.stdout
    if overrides:
        assert "model_type: roberta" in ours.stdout and "lr: 0.5" in ours.stdout  # model=tiny: from scratch
    assert "hydra" in imported(ours.stderr) and not {"torch", "transformers", "datasets"} & imported(ours.stderr)


def test_cfg_job_prints_the_config_without_torch(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "train.py"), "--cfg", "job", "model=tiny",
                           "train.compile=true"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["model"]["scratch"]["model_type"] == "roberta" and cfg["train"]["compile"] is True
    assert cfg["data"]["bucket"] == 50 and cfg["optimizer"]["fused"] is True and cfg["model"]["attention"] == "sdpa"
    assert "hydra" in imported(proc.stderr) and not {"torch", "transformers", "datasets"} & imported(proc.stderr)


def test_help_with_a_bad_override_is_hydras_error(tmp_path: Path) -> None:
    proc = run_train(["--help", "model=nope"], cwd=tmp_path, timeout=60)
    assert proc.returncode != 0 and "Could not find 'model/nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_vertex_directories_become_the_output_and_checkpoint_dirs() -> None:
    """Vertex AI sets AIP_MODEL_DIR and AIP_CHECKPOINT_DIR; a run there writes to them."""
    env = {**os.environ, "AIP_MODEL_DIR": "gs://bucket/job/model", "AIP_CHECKPOINT_DIR": "gs://bucket/job/checkpoints"}
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--cfg", "job", "--resolve"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["output_dir"] == "gs://bucket/job/model"
    assert cfg["train"]["checkpoint_dir"] == "gs://bucket/job/checkpoints"
    assert build_config([]).train.checkpoint_dir is None  # elsewhere: <output_dir>/checkpoints
