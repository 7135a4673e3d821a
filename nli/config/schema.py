"""Typed schema for every config group, registered in Hydra's ConfigStore.

Each YAML under ``conf/<group>/`` names its schema in its defaults list, so a misspelt key or a
wrong type fails while Hydra composes the config. Rules that span values (a positive learning
rate, a batch size the per-device batch divides) live in ``__post_init__`` and run when
``OmegaConf.to_object`` builds these dataclasses, at the top of the run, before any data or
model loads. This module must stay light: ``train.py --help`` imports it, and torch is not
imported on that path.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from nli.config import runfolder
from nli.config.identity import check_accepted
from nli.config.keys import built, unselected_logger
from nli.errors import ConfigError


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


# --------------------------------------------------------------------------------------- model


@dataclass
class ScratchArchitecture:
    """A model built from config with random weights, and a byte-level BPE tokenizer trained on
    the task's training text: runs with no download."""

    model_type: str = "roberta"  # any transformers model type with a sequence-classification head
    vocab_size: int = 2048  # tokens in the BPE vocabulary learnt from the training text
    hidden_size: int = 128  # width of every layer
    num_hidden_layers: int = 2  # transformer blocks
    num_attention_heads: int = 4  # must divide hidden_size
    intermediate_size: int = 512  # feed-forward width
    max_position_embeddings: int = 258  # positions; RoBERTa needs max_seq_length + 2
    dropout: float = 0.1  # hidden and attention dropout probability

    def __post_init__(self) -> None:
        # Checked first: a zero head count would end the divisibility check below in ZeroDivisionError.
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            value = getattr(self, key)
            _require(value >= 1, f"model.scratch.{key}={value} must be at least 1")
        _require(
            self.hidden_size % self.num_attention_heads == 0,
            f"model.scratch.num_attention_heads={self.num_attention_heads} must divide "
            f"model.scratch.hidden_size={self.hidden_size}",
        )
        _require(self.vocab_size >= 300, "model.scratch.vocab_size must be at least 300 "
                 "(256 byte symbols plus special tokens and merges)")
        _require(0 <= self.dropout < 1, f"model.scratch.dropout={self.dropout} must be in [0, 1) "
                 "(a probability; 1 would drop every activation), e.g. model.scratch.dropout=0.1")


@dataclass
class LoraConfig:
    """LoRA (Hu et al. 2021) through peft: each targeted Linear layer's weight W is frozen and learns an
    update (alpha / r) x B A of rank r; the classification head trains in full; the rest is frozen."""

    r: int = 8  # rank of each update B A (columns of B, rows of A)
    alpha: int = 8  # the update is scaled by alpha / r
    dropout: float = 0.0  # dropout probability on each adapter's input
    # names of the Linear modules to adapt (the last part of their path, e.g. [query, value]); null: the family's
    # default (nli.model.lora.DEFAULT_TARGETS: the attention's query and value projections)
    target_modules: Optional[List[str]] = None

    def __post_init__(self) -> None:
        _require(self.r >= 1, f"model.peft.r={self.r} must be at least 1 (the rank of each adapter's update), "
                 "e.g. model.peft.r=8")
        _require(self.alpha > 0, f"model.peft.alpha={self.alpha} must be positive (the update is scaled by "
                 "alpha / r), e.g. model.peft.alpha=8")
        _require(0 <= self.dropout < 1, f"model.peft.dropout={self.dropout} must be in [0, 1) (a probability), "
                 "e.g. model.peft.dropout=0.1")
        _require(self.target_modules is None or (len(self.target_modules) > 0 and all(self.target_modules)),
                 f"model.peft.target_modules={self.target_modules} must name at least one module, e.g. "
                 "model.peft.target_modules=[query,value], or be null for the family's default")


class Attention(str, Enum):
    """transformers' attention implementations (``attn_implementation``) for these encoders."""

    sdpa = "sdpa"  # torch's scaled_dot_product_attention: fused kernels (flash, memory-efficient) where they apply
    eager = "eager"  # the model's own matmul-softmax-matmul, as in the original papers' code
    flash_attention_2 = "flash_attention_2"  # needs the flash-attn package and a GPU


@dataclass
class ModelConfig:
    name_or_path: Optional[str] = MISSING  # Hub id or local checkpoint dir; null: build `scratch`
    scratch: Optional[ScratchArchitecture] = None  # architecture when name_or_path is null
    revision: str = "main"  # Hub branch, tag or commit of name_or_path
    dropout: Optional[float] = None  # override the checkpoint's dropout probability; null: keep it
    classifier_dropout: Optional[float] = None  # the classification head's dropout; null: the model's own
    ignore_mismatched_sizes: bool = False  # replace a checkpoint's classification head of another size
    attention: Attention = Attention.sdpa  # how attention is computed
    fast_paths: bool = True  # faster forward where it applies (nli/model/fastpaths); false: transformers' own
    # adapters, chosen by model/peft=lora (nli/model/lora.py); null: every weight trains
    peft: Optional[LoraConfig] = None

    def __post_init__(self) -> None:
        both = (f"; both are set: model.scratch=null reads {self.name_or_path}, model.name_or_path=null builds "
                "model.scratch" if self.name_or_path is not None else "")
        _require(
            (self.name_or_path is None) != (self.scratch is None),
            "set exactly one of model.name_or_path (a pretrained checkpoint) and "
            f"model.scratch (an architecture with random weights){both}",
        )
        _require(self.dropout is None or 0 <= self.dropout < 1,
                 f"model.dropout={self.dropout} must be in [0, 1) (a probability; 1 would drop every "
                 "activation), e.g. model.dropout=0.1, or null to keep the checkpoint's")
        _require(self.classifier_dropout is None or 0 <= self.classifier_dropout < 1,
                 f"model.classifier_dropout={self.classifier_dropout} must be in [0, 1), or null for the model's own")
        # model.dropout overrides a checkpoint's; a scratch model takes its own, so it would be ignored.
        _require(self.dropout is None or self.scratch is None,
                 f"model.dropout={self.dropout} sets a pretrained checkpoint's dropout, and this model is built "
                 f"from scratch (model.scratch): set model.scratch.dropout={self.dropout} instead")
        # Nothing of a model from scratch is downloaded: a revision would be recorded, and no run would have read it.
        _require(self.revision == "main" or self.scratch is None,
                 f"model.revision={self.revision} picks a branch, tag or commit of a Hub checkpoint, and this model is "
                 "built from scratch (model.scratch): drop model.revision")

    @property
    def pretrained(self) -> bool:
        return self.name_or_path is not None


# ---------------------------------------------------------------------------------------- task


# What nli.evaluate.metrics computes; a task may report any of these.
METRIC_NAMES = ("accuracy", "f1", "matthews_correlation", "pearson", "spearmanr")
SCORE_METRICS = ("pearson", "spearmanr")  # a regression's; the others compare label ids
BINARY_METRICS = ("f1",)  # the F1 of label 1, as GLUE's MRPC and QQP report it: two labels alone
# The mean of a task's metrics where it has more than one, as GLUE's leaderboard scores a task.
COMBINED = "combined_score"


@dataclass
class GlueFilesConfig:
    """How the task's files look in their original download (for ``data.dir``): GLUE's tab-separated
    files, or another set's own (SNLI's and ANLI's JSON Lines, HANS's tab-separated text), read by
    their extension: ``.jsonl`` one JSON object per line, anything else tab-separated with a header."""

    folder: str = MISSING  # the task's folder in data.dir, e.g. MNLI (glue_data/MNLI), anli_v1.0/R1
    files: Dict[str, str] = MISSING  # split -> file in the folder, e.g. validation_matched: dev_matched.tsv
    columns: Dict[str, str] = MISSING  # each text field, `label` and each of task.groups -> the file column
    label_values: Optional[List[str]] = None  # how the files write each label, in label order; null: label_names
    headerless: List[str] = field(default_factory=list)  # splits whose file has no header row (CoLA's train, dev)
    header: List[str] = field(default_factory=list)  # the column names of those header-less files
    index_column: str = "index"  # the column numbering test examples, copied into the predictions


@dataclass
class DiagnosticConfig:
    """GLUE's diagnostic set (AX): unlabelled pairs that a task's model (MNLI's) predicts, with train.predict,
    as one more file of a GLUE submission. Where it is not at hand the run writes the other files and says so."""

    submission: str = "AX"  # its file in the submission: AX.tsv
    glue_file: str = "diagnostic/diagnostic.tsv"  # under data.dir, where GLUE's download puts it
    hub_config: str = "ax"  # on the Hub: this config of task.hub_dataset
    hub_split: str = "test"  # the split of hub_config that holds it


DIAGNOSTIC_SPLIT = "diagnostic"  # the diagnostic set among a run's test splits (task.diagnostic)


@dataclass
class TaskConfig:
    """One row of the GLUE task table."""

    name: str = MISSING  # lower-case task name, as on the Hub (mnli, rte, ...)
    hub_dataset: Optional[str] = "nyu-mll/glue"  # Hub dataset id (or a local copy of its repo); null: generated
    hub_config: Optional[str] = None  # the dataset's config (subset) name on the Hub
    hub_revision: Optional[str] = None  # the Hub dataset's branch, tag or commit; null: its main branch
    hub_data_dir: Optional[str] = None  # the folder of the Hub dataset's files to read; null: the whole dataset
    text_fields: List[str] = MISSING  # one or two input columns, e.g. [premise, hypothesis]
    label_names: List[str] = field(default_factory=list)  # label ids in order; empty: regression
    train_split: str = "train"  # split used for training
    eval_splits: Dict[str, str] = MISSING  # eval split -> suffix of its metric names ("" or _mm)
    test_splits: Dict[str, str] = field(default_factory=dict)  # test split -> its GLUE submission file (MNLI-m)
    metrics: List[str] = MISSING  # metric names reported on every eval split
    main_metric: str = MISSING  # picks the best checkpoint and is the objective (combined_score: the mean)
    # how the original files write "no gold label" (SNLI: -); such examples (and the Hub's label -1) are
    # left out of training and evaluation, and counted in the log; null: every label must be known
    no_gold_label: Optional[str] = None
    # columns kept to report accuracy on each of their values, and on each value x gold label (HANS: heuristic)
    groups: List[str] = field(default_factory=list)
    glue: Optional[GlueFilesConfig] = None  # the task's original-file layout (for data.dir); null: none
    diagnostic: Optional[DiagnosticConfig] = None  # GLUE's diagnostic set, predicted with the test splits; null: none

    def __post_init__(self) -> None:
        _require(1 <= len(self.text_fields) <= 2, f"task.text_fields must name one or two "
                 f"columns, got {self.text_fields}")
        unknown = sorted(set(self.metrics) - set(METRIC_NAMES))
        _require(not unknown, f"task.metrics has unknown {unknown}; known: {list(METRIC_NAMES)}")
        self._check_metrics_fit()
        reported = self.metrics + ([COMBINED] if len(self.metrics) > 1 else [])
        _require(self.main_metric in reported, f"task.main_metric={self.main_metric} must be one of "
                 f"{reported}")
        _require(len(self.eval_splits) > 0, "task.eval_splits must name at least one split")
        _require(not self.groups or not self.is_regression, f"task.groups={self.groups} reports accuracy per "
                 f"group, and task={self.name} is a regression: set task.groups=[]")
        if self.glue is not None:
            self._check_glue(self.glue)

    def _check_metrics_fit(self) -> None:
        """Each metric fits the task's labels: scored after training otherwise, they failed at its first evaluation
        (scikit-learn's "Target is multiclass but average='binary'", or a correlation of label ids)."""
        if self.is_regression:
            wrong = [name for name in self.metrics if name not in SCORE_METRICS]
            _require(not wrong, f"task.metrics={self.metrics}: {wrong} compare labels, and task={self.name} is a "
                     f"regression (no label_names): its metrics are {list(SCORE_METRICS)}")
            return
        wrong = [name for name in self.metrics if name in SCORE_METRICS]
        _require(not wrong, f"task.metrics={self.metrics}: {wrong} correlate scores, and task={self.name} has labels "
                 f"{self.label_names}: use accuracy, matthews_correlation or (two labels) f1")
        if len(self.label_names) != 2:
            wrong = [name for name in self.metrics if name in BINARY_METRICS]
            _require(not wrong, f"task.metrics={self.metrics}: {wrong} is the F1 of label 1 against the other, and "
                     f"task={self.name} has {len(self.label_names)} labels: use accuracy or matthews_correlation")

    def _check_glue(self, glue: GlueFilesConfig) -> None:
        needed = set(self.text_fields) | {"label"} | set(self.groups)
        _require(needed <= set(glue.columns), f"task.glue.columns must map each of {sorted(needed)} "
                 f"to a file column; it maps {sorted(glue.columns)}")
        splits = {self.train_split, *self.eval_splits, *self.test_splits}
        _require(splits <= set(glue.files), f"task.glue.files must name a file for each split "
                 f"{sorted(splits)}; it names {sorted(glue.files)}")
        _require(not glue.headerless or bool(glue.header),
                 "task.glue.header must name the columns of the task.glue.headerless files")
        _require(glue.label_values is None or len(glue.label_values) == len(self.label_names),
                 f"task.glue.label_values={glue.label_values} must give one value per label "
                 f"{self.label_names}")

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    def submission_file(self, split: str) -> str:
        """The name, without ``.tsv``, of a test split's file in a GLUE submission (MNLI-m, AX)."""
        if split == DIAGNOSTIC_SPLIT and self.diagnostic is not None:
            return self.diagnostic.submission
        return self.test_splits[split]

    @property
    def is_generated(self) -> bool:
        """The project makes this task's examples itself (nli/data/synthetic.py)."""
        return self.name == "synthetic"

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1

    @property
    def main_split(self) -> str:
        """The eval split whose main metric selects the best model (MNLI: matched)."""
        return next(iter(self.eval_splits))

    @property
    def file_labels(self) -> List[str]:
        """Each label as GLUE's own files and submissions write it (CoLA: 0 and 1), in id order."""
        if self.glue is not None and self.glue.label_values is not None:
            return list(self.glue.label_values)
        return list(self.label_names)


# ------------------------------------------------------------------------------------ optimizer


@dataclass
class OptimizerConfig:
    _target_: str = MISSING  # the optimizer class, built with hydra.utils.instantiate
    lr: float = MISSING  # peak learning rate
    weight_decay: float = 0.0  # decoupled for AdamW; never applied to biases and LayerNorm
    # Layer-wise learning-rate decay (ELECTRA: 0.8 base, 0.9 large): a layer's rate is lr x decay^(its
    # depth from the top), the top layer's lr x decay, the embeddings' the smallest; null: one rate
    layer_decay: Optional[float] = None
    head_lr_scale: float = 1.0  # the classification head's rate as a multiple of lr

    def __post_init__(self) -> None:
        _require(self.lr > 0, f"optimizer.lr={self.lr} must be positive (e.g. optimizer.lr=2e-5)")
        _require(self.weight_decay >= 0, f"optimizer.weight_decay={self.weight_decay} must be >= 0")
        _require(self.layer_decay is None or 0 < self.layer_decay <= 1,
                 f"optimizer.layer_decay={self.layer_decay} must be in (0, 1] (e.g. 0.8), or null for one rate")
        _require(self.head_lr_scale > 0, f"optimizer.head_lr_scale={self.head_lr_scale} must be positive")


@dataclass
class AdamConfig(OptimizerConfig):
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # moment decay rates
    eps: float = 1e-8  # added to the denominator for stability
    fused: bool = True  # one fused kernel for the whole update (CPU and GPU), as the HF Trainer's default

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                 f"optimizer.betas={self.betas} must be two numbers in [0, 1)")


@dataclass
class SGDConfig(OptimizerConfig):
    momentum: float = 0.9  # heavy-ball momentum
    nesterov: bool = False  # Nesterov momentum


@dataclass
class ScheduleConfig:
    # the schedule's function, (optimizer, *, warmup_steps, total_steps) -> an LR scheduler (nli.train.optim)
    _target_: str = MISSING
    warmup_ratio: float = 0.0  # warm-up as a fraction of all optimizer steps
    warmup_steps: Optional[int] = None  # warm-up in optimizer steps; overrides warmup_ratio

    def __post_init__(self) -> None:
        _require(0 <= self.warmup_ratio < 1, f"schedule.warmup_ratio={self.warmup_ratio} must be in [0, 1)")
        _require(self.warmup_steps is None or self.warmup_steps >= 0,
                 f"schedule.warmup_steps={self.warmup_steps} must be >= 0")

    def num_warmup_steps(self, total_steps: int) -> int:
        """Optimizer steps of warm-up: ``warmup_steps`` as given, or the ratio of the run rounded up (as the
        Trainer rounds it), short of the run's last step: a fraction of the run always leaves the rate at
        optimizer.lr for at least one step (``train.max_steps=1`` warms up for none)."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return min(math.ceil(self.warmup_ratio * total_steps), max(total_steps - 1, 0))

    def check_warmup(self, total_steps: int, length: str) -> None:
        """A warm-up in steps must end before the run does, or the rate never reaches optimizer.lr; ``length``
        says where ``total_steps`` comes from. (One given as a ratio always does: :meth:`num_warmup_steps`.)"""
        warmup = self.num_warmup_steps(total_steps)
        fewer = min(max(1, total_steps // 10), total_steps - 1)
        _require(warmup == 0 or warmup < total_steps,
                 f"schedule.warmup_steps={self.warmup_steps} warms up for {warmup} optimizer steps, and the run has "
                 f"{total_steps} ({length}): the learning rate would still be rising when training ends, and never "
                 f"reach optimizer.lr. Warm up for fewer steps, e.g. schedule.warmup_steps={fewer}, or for a "
                 "fraction of the run: schedule.warmup_steps=null (schedule.warmup_ratio, 0.06 by default)")


# ------------------------------------------------------------------------- precision, hardware


class Precision(str, Enum):
    auto = "auto"  # what the device computes natively: bf16 (GPUs of compute capability 8.0+), else fp16 (7.x), fp32
    fp32 = "fp32"
    fp16 = "fp16"  # autocast to float16 with dynamic loss scaling
    bf16 = "bf16"  # autocast to bfloat16


@dataclass
class PrecisionConfig:
    dtype: Precision = MISSING  # compute precision of the forward and backward pass
    tf32: bool = True  # TensorFloat-32 matmuls on Ampere and newer GPUs (fp32 parts)


class Accelerator(str, Enum):
    auto = "auto"  # a CUDA GPU if this machine has one, else the CPU
    cpu = "cpu"
    cuda = "cuda"
    # PyTorch/XLA (requirements/tpu.txt, nli.runtime.xla): a Cloud TPU, or XLA's CPU device (PJRT_DEVICE=CPU)
    xla = "xla"


@dataclass
class VertexMachine:
    """The machine Vertex AI runs a job of this hardware on (read by the Vertex launcher through
    nli.contract.job_needs)."""

    machine_type: Optional[str] = None  # Google Cloud machine type, e.g. a2-highgpu-1g; null: the launcher's default
    accelerator_type: Optional[str] = None  # Vertex AI accelerator type, e.g. NVIDIA_TESLA_A100 or TPU_V3; null: none
    accelerator_count: Optional[int] = None  # accelerators per machine; null: hw.gpus_per_node (or hw.tpu_devices)
    tpu_topology: Optional[str] = None  # TPU VMs (ct5lp-hightpu-*): the slice's chips, e.g. 2x4; null otherwise


@dataclass
class HardwareConfig:
    """A machine: what runs the job here, and what a launcher asks a cloud for."""

    accelerator: Accelerator = MISSING  # device kind the run uses
    gpu: Optional[str] = None  # GPU model, e.g. V100; null for CPU or auto
    gpus_per_node: int = 0  # GPUs on one machine (0: CPU or TPU)
    tpu: Optional[str] = None  # TPU generation, e.g. v5e (accelerator=xla)
    tpu_devices: int = 0  # XLA devices on one TPU host, one process each: TensorCores on v2/v3 (8), chips on v5e
    nodes: int = 1  # machines; more than one run as Vertex AI worker pools or Slurm nodes
    bf16: bool = False  # the GPU computes bfloat16 natively (Ampere and newer): precision=auto may pick bf16
    fp16: bool = False  # the GPU has float16 tensor cores (Volta and newer): precision=auto may pick fp16
    per_device_batch_size: Optional[int] = None  # examples per device per micro-step; null: whole batch
    # torch threads per process; null: this run's share of the free cores (nli.runtime.cpu)
    cpu_threads: Optional[int] = None
    cpu_mmap_threshold: Optional[int] = None  # CPU: glibc's mmap threshold, bytes (less memory, slower); null: glibc's
    collective_timeout_minutes: int = 60  # how long a process waits for the others (rank 0 saving, say), minutes
    rendezvous_timeout_minutes: float = 15.0  # how long a process waits for the others to join as it starts, minutes
    vertex: VertexMachine = field(default_factory=VertexMachine)  # the machine on Vertex AI

    def __post_init__(self) -> None:
        _require(self.per_device_batch_size is None or self.per_device_batch_size > 0,
                 f"hw.per_device_batch_size={self.per_device_batch_size} must be positive")
        _require(self.accelerator != Accelerator.cuda or self.gpus_per_node > 0,
                 "hw.gpus_per_node must be at least 1 when hw.accelerator=cuda")
        _require(self.accelerator != Accelerator.xla or self.tpu_devices > 0,
                 "hw.tpu_devices must be at least 1 when hw.accelerator=xla")
        _require(self.nodes >= 1, f"hw.nodes={self.nodes} must be at least 1")
        minutes = self.collective_timeout_minutes
        _require(minutes >= 1, f"hw.collective_timeout_minutes={minutes} must be at least 1 (minutes a process "
                 "waits for the others before the run fails)")
        joining = self.rendezvous_timeout_minutes
        _require(joining > 0, f"hw.rendezvous_timeout_minutes={joining} must be more than 0 (minutes a process waits "
                 "for the others to join as the run starts)")
        _require(self.cpu_threads is None or self.cpu_threads >= 1,
                 f"hw.cpu_threads={self.cpu_threads} must be at least 1, or null for this run's share of the cores")
        _require(self.cpu_mmap_threshold is None or 0 <= self.cpu_mmap_threshold <= 32 * 2**20,
                 f"hw.cpu_mmap_threshold={self.cpu_mmap_threshold} must be in [0, 33554432] bytes (glibc's limit), "
                 "or null for glibc's own")

    @property
    def data_parallel_size(self) -> int:
        """Processes that share one global batch (one per GPU or TPU device on every node; one per CPU node)."""
        return self.nodes * max(self.devices_per_node, 1)

    @property
    def devices_per_node(self) -> int:
        """The accelerators one machine runs a process for: its GPUs, or its TPU's XLA devices."""
        return self.tpu_devices if self.accelerator == Accelerator.xla else self.gpus_per_node


# --------------------------------------------------------------------------------------- logger


class WandbMode(str, Enum):
    online = "online"
    offline = "offline"
    disabled = "disabled"


@dataclass
class LoggerConfig:
    """One logger: ``logger=wandb`` selects one, ``logger=[wandb,tensorboard]`` several, each under
    its own key (``logger.wandb.mode=offline``)."""

    _target_: str = MISSING  # the logger's class, built with hydra.utils.instantiate (nli.tracking.loggers)


@dataclass
class WandbConfig(LoggerConfig):
    mode: Optional[WandbMode] = None  # offline: files to `wandb sync` later; null: WANDB_MODE, else online
    project: Optional[str] = None  # W&B project; null: WANDB_PROJECT (or wandb's settings file), else nli
    entity: Optional[str] = None  # W&B team or user; null: WANDB_ENTITY, else your default entity
    group: Optional[str] = None  # groups the runs of a sweep; null: the Hydra sweep directory name
    tags: List[str] = field(default_factory=list)  # free-form tags
    log_model: bool = False  # at the end, the exported model/ as the run's W&B artifact (type model)


@dataclass
class TensorBoardConfig(LoggerConfig):
    subdir: str = "tensorboard"  # event files go to <output_dir>/<subdir>


@dataclass
class CsvConfig(LoggerConfig):
    file: str = "metrics.csv"  # one row per logged value (step, metric, value) in <output_dir>/<file>


# ---------------------------------------------------------------------------------- data, train


@dataclass
class DataConfig:
    dir: Optional[str] = None  # a local GLUE directory (glue_data/ holding RTE/, MNLI/, ...); null: the Hub
    files: Dict[str, str] = field(default_factory=dict)  # split -> your own csv, jsonl or parquet file
    columns: Dict[str, str] = field(default_factory=dict)  # text field or `label` -> its column in data.files
    max_seq_length: int = 128  # tokens per example after truncation
    max_train_samples: Optional[int] = None  # use at most this many training examples
    max_eval_samples: Optional[int] = None  # use at most this many examples per eval split
    fraction_of_train_data: float = 1.0  # use this random fraction of the training set
    synthetic_train_size: int = 6000  # examples the synthetic task generates for training
    synthetic_eval_size: int = 1000  # examples the synthetic task generates for evaluation
    synthetic_version: int = 2  # the synthetic task's version (nli/data/synthetic.py); 1: the task until Nov 2026
    num_workers: Optional[int] = None  # DataLoader worker processes; null: 2 on a GPU, 0 elsewhere (workers())
    bucket: int = 50  # global batches sorted together by length, so batches pad little; 0: plain random order

    def __post_init__(self) -> None:
        _require(self.max_seq_length >= 8, f"data.max_seq_length={self.max_seq_length} must be >= 8")
        _require(0 < self.fraction_of_train_data <= 1,
                 f"data.fraction_of_train_data={self.fraction_of_train_data} must be in (0, 1]")
        for key in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, key)
            _require(value is None or value > 0, f"data.{key}={value} must be positive or null")
        # An empty split would make an epoch of no steps: training would never advance.
        for key in ("synthetic_train_size", "synthetic_eval_size"):
            value = getattr(self, key)
            _require(value >= 1, f"data.{key}={value} must be at least 1 (examples to generate)")
        _require(self.synthetic_version in (1, 2), f"data.synthetic_version={self.synthetic_version}: the synthetic "
                 "task has versions 1 (the task until November 2026, for runs started on it) and 2 (the default)")
        _require(self.num_workers is None or self.num_workers >= 0, f"data.num_workers={self.num_workers} must be "
                 ">= 0 (0: load batches in the training process), or null for 2 on a GPU and 0 elsewhere")
        # A negative bucket count draws an empty epoch order (EpochSampler): the loop would spin at step 0.
        _require(self.bucket >= 0, f"data.bucket={self.bucket} must be >= 0 (global batches sorted "
                 "together by length; 0: plain random order)")


    def workers(self, device_type: str) -> int:
        """DataLoader workers for a run on ``device_type``: data.num_workers, or by default two on a GPU, where
        batches collated in the training process would leave it waiting each step, and none on the CPU (or a
        TPU host), whose cores the training itself computes on."""
        if self.num_workers is not None:
            return self.num_workers
        return 2 if device_type == "cuda" else 0


@dataclass
class EarlyStoppingConfig:
    """Stop training once the task's main metric has not improved for ``patience`` evaluations."""

    patience: Optional[int] = None  # evaluations without improvement before training stops; null: never
    min_delta: float = 0.0  # rise of the main metric that counts as an improvement (in its own units)

    def __post_init__(self) -> None:
        _require(self.patience is None or self.patience >= 1,
                 f"train.early_stopping.patience={self.patience} must be at least 1, or null to train to the end")
        _require(self.min_delta >= 0, f"train.early_stopping.min_delta={self.min_delta} must be >= 0")

    @property
    def enabled(self) -> bool:
        return self.patience is not None


@dataclass
class TrainConfig:
    epochs: float = 3.0  # passes over the training set (fractions allowed)
    max_steps: Optional[int] = None  # optimizer steps; overrides epochs when set
    batch_size: int = 32  # global batch: examples per optimizer step, whatever the hardware
    eval_batch_size: int = 128  # examples per device per evaluation step
    eval_every: Optional[int] = None  # evaluate every N optimizer steps; null: each epoch's end
    log_every: int = 50  # optimizer steps between logged training metrics
    max_grad_norm: Optional[float] = 1.0  # clip the gradient norm to this; null: no clipping
    progress_bar: bool = True  # tqdm bar with loss, learning rate and examples/s, on a terminal only
    predict: bool = False  # write test-set predictions in GLUE's submission format (<TASK>.tsv)
    checkpoint_every: int = 1000  # optimizer steps between checkpoints (there is one at each evaluation too)
    keep_checkpoints: int = 2  # newest checkpoints kept, besides the best one
    checkpoint_dir: Optional[str] = None  # local path or gs://; null: the platform's, else <output_dir>/checkpoints
    resume: bool = True  # continue from the newest checkpoint in the output directory; false: refuse to
    skip_nonfinite: int = 0  # steps with a NaN or infinite loss to skip (no update) before stopping
    label_smoothing: float = 0.0  # cross-entropy's label smoothing (classification tasks); 0: none
    compile: bool = False  # torch.compile the training model: faster steps after a compile of minutes
    # recompute each layer's activations in the backward pass instead of keeping them (non-reentrant):
    # much less activation memory (a large model on one GPU) for about a third more compute
    gradient_checkpointing: bool = False
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)  # stop when the metric stalls
    # keys whose new values a run continues with, where its folder holds it with other ones (logged)
    accept_changes: List[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_accepted(self.accept_changes)
        _require(self.batch_size > 0, f"train.batch_size={self.batch_size} must be positive")
        _require(self.eval_batch_size > 0, f"train.eval_batch_size={self.eval_batch_size} must be positive")
        _require(self.epochs > 0, f"train.epochs={self.epochs} must be positive")
        # Unless max_steps overrides it, the step count is ceil(epochs x steps per epoch): it must be finite.
        _require(self.max_steps is not None or math.isfinite(self.epochs),
                 f"train.epochs={self.epochs} must be a finite number of passes; to train for a number of "
                 "steps instead, set train.max_steps")
        for key in ("max_steps", "eval_every"):
            value = getattr(self, key)
            _require(value is None or value > 0, f"train.{key}={value} must be positive or null")
        _require(self.log_every > 0, f"train.log_every={self.log_every} must be positive")
        _require(self.checkpoint_every > 0, f"train.checkpoint_every={self.checkpoint_every} must be positive")
        _require(self.keep_checkpoints >= 1, f"train.keep_checkpoints={self.keep_checkpoints} must be >= 1")
        _require(self.skip_nonfinite >= 0, f"train.skip_nonfinite={self.skip_nonfinite} must be >= 0")
        _require(0 <= self.label_smoothing < 1, f"train.label_smoothing={self.label_smoothing} must be in [0, 1)")
        _require(self.max_grad_norm is None or self.max_grad_norm > 0,
                 f"train.max_grad_norm={self.max_grad_norm} must be positive or null")


# ----------------------------------------------------------------------------------------- eval


# The evaluation sets eval.extra takes, each the task (conf/task/<name>.yaml) or tasks it stands for:
# `anli` is its three rounds, each with its own dev and test sets.
EVAL_SETS: Dict[str, Tuple[str, ...]] = {
    "snli": ("snli",),
    "anli": ("anli_r1", "anli_r2", "anli_r3"),
    "anli_r1": ("anli_r1",),
    "anli_r2": ("anli_r2",),
    "anli_r3": ("anli_r3",),
    "hans": ("hans",),
    "mnli": ("mnli",),
}


# What only training reads: an evaluation-only run says so where the command sets one of these.
TRAINING_ONLY = ("optimizer", "schedule", "train.epochs", "train.max_steps", "train.batch_size", "train.eval_every",
                 "train.log_every", "train.max_grad_norm", "train.checkpoint_every", "train.keep_checkpoints",
                 "train.checkpoint_dir", "train.skip_nonfinite", "train.label_smoothing",
                 "train.gradient_checkpointing", "train.compile", "train.early_stopping", "data.max_train_samples",
                 "data.fraction_of_train_data", "data.synthetic_train_size",
                 # a trained model is read as it was saved (nli.model.build.load_trained): its dropout and head kept
                 "model.dropout", "model.classifier_dropout", "model.ignore_mismatched_sizes")


@dataclass
class EvalConfig:
    """What a run evaluates besides its task's eval splits, and whether it only evaluates."""

    # sets to score the best model on at the end: snli, anli (its rounds, or anli_r1 to _r3), hans, mnli;
    # each under its own keys in results.json (hans/accuracy, anli_r1/accuracy_test), e.g. [hans,anli,snli]
    extra: List[str] = field(default_factory=list)
    # evaluate model.name_or_path (a Hub id, a checkpoint directory or a run folder) on the task's eval
    # splits and eval.extra, without training: no optimizer, no checkpoints, no training set. A run folder
    # (or its model/) gives its task, data and sequence length, where the command sets none (nli/config/runfolder.py)
    only: bool = False
    # a folder holding the extra sets' original downloads (snli_1.0/, anli_v1.0/, hans/); null: the Hub
    dir: Optional[str] = None
    # write each eval example's prediction (label, prediction, each class's probability, text) of the final
    # evaluation to eval_predictions/<split>.jsonl; false: none (a very large eval set)
    save_predictions: bool = True

    def __post_init__(self) -> None:
        unknown = [name for name in self.extra if name not in EVAL_SETS]
        _require(not unknown, f"eval.extra={self.extra}: unknown evaluation set(s) {unknown}; known: "
                 f"{', '.join(sorted(EVAL_SETS))}")
        _require(self.dir is None or bool(self.extra), f"eval.dir={self.dir} says where the sets of eval.extra "
                 "are, and eval.extra is empty: name them, e.g. eval.extra=[hans,anli,snli], or drop eval.dir")

    @staticmethod
    def ignores(keys: Sequence[str]) -> List[str]:
        """Which of ``keys`` (overrides' keys and groups) an evaluation-only run does not read: it trains nothing."""
        return [key for key in keys if any(key == each or key.startswith(f"{each}.") for each in TRAINING_ONLY)]

    def tasks(self) -> List[str]:
        """The tasks eval.extra stands for, each once, in the order given."""
        return list(dict.fromkeys(task for name in self.extra for task in EVAL_SETS[name]))


# ----------------------------------------------------------------------------------------- root


@dataclass
class Config:
    model: ModelConfig = MISSING  # the encoder and its tokenizer, chosen by model=
    task: TaskConfig = MISSING  # the GLUE task (or your own), chosen by task=
    optimizer: Any = MISSING  # one of OptimizerConfig's subclasses, chosen by optimizer=
    schedule: ScheduleConfig = MISSING  # the learning rate over the steps, chosen by schedule=
    precision: PrecisionConfig = MISSING  # the forward and backward pass's number format, chosen by precision=
    hw: HardwareConfig = MISSING  # the machine, chosen by hw=
    logger: Dict[str, Any] = field(default_factory=dict)  # name -> LoggerConfig; logger=[a,b] selects several
    data: DataConfig = field(default_factory=DataConfig)  # where the examples come from, and how many
    train: TrainConfig = field(default_factory=TrainConfig)  # how long, how often to look, checkpoints
    eval: EvalConfig = field(default_factory=EvalConfig)  # extra evaluation sets; evaluation-only runs
    seed: int = 42  # seeds Python, NumPy and torch
    # results, model and logs (local or gs://); null: the platform's, else the Hydra run dir
    output_dir: Optional[str] = None

    def __post_init__(self) -> None:
        # NumPy's legacy seeding (nli.train.checkpoint.seed_everything) takes 0 to 2**32 - 1, and raises on more.
        _require(0 <= self.seed < 2**32, f"seed={self.seed} must be between 0 and 2**32 - 1 = {2**32 - 1} "
                 "(the range NumPy's generator takes), e.g. seed=42")
        self.check_batch(self.hw.data_parallel_size)
        self._check_precision()
        self._check_data_source()
        self._check_loggers()
        self._check_scratch_positions()
        self._check_eval()
        if self.train.max_steps is not None:  # else the length is known once the data is (nli.train.optim)
            self.schedule.check_warmup(self.train.max_steps, f"train.max_steps={self.train.max_steps}")
        _require(not (self.train.label_smoothing and self.task.is_regression),
                 f"train.label_smoothing={self.train.label_smoothing} smooths class labels, and task={self.task.name} "
                 "is a regression: set train.label_smoothing=0")

    def _check_eval(self) -> None:
        evaluation, task = self.eval, self.task
        _require(not evaluation.only or self.model.pretrained, "eval.only=true evaluates a trained model, and "
                 "model.scratch builds an untrained one: set model.name_or_path to a run folder, a checkpoint "
                 "directory or a Hub id (and model.scratch=null)")
        _require(task.name not in evaluation.tasks(), f"eval.extra={evaluation.extra} names task={task.name}, the "
                 f"run's own task, whose metrics are results.json's own keys: leave {task.name} out of eval.extra")
        _require(not evaluation.only or self.model.peft is None, "eval.only=true evaluates a trained model as it "
                 "is, and model/peft=lora adds new adapters to train: drop model/peft=lora (a LoRA run's model/ "
                 "holds its adapters merged into the weights)")
        _require(not evaluation.extra or not task.is_regression, f"eval.extra={evaluation.extra} scores a classifier "
                 f"by its labels, and task={task.name} is a regression: its model has none")

    def _check_scratch_positions(self) -> None:
        """A pretrained checkpoint's positions are checked when its config is read (nli.model.build)."""
        scratch = self.model.scratch
        if scratch is None:
            return
        # RoBERTa numbers positions from padding_idx + 1, so it needs two spare positions.
        spare = 2 if scratch.model_type in ("roberta", "xlm-roberta", "camembert") else 0
        needed = self.data.max_seq_length + spare
        _require(scratch.max_position_embeddings >= needed,
                 f"model.scratch.max_position_embeddings={scratch.max_position_embeddings} must be at least "
                 f"data.max_seq_length{f' + {spare}' if spare else ''} = {needed}")

    def check_batch(self, world_size: int) -> None:
        """The global batch must split evenly into micro-batches across ``world_size`` devices."""
        batch, micro = self.train.batch_size, self.micro_batch_size(world_size)
        _require(batch >= world_size,
                 f"train.batch_size={batch} is smaller than the {world_size} devices the run is on (each device "
                 f"takes at least one example a step): set train.batch_size to a multiple of {world_size}, or "
                 "choose hw with fewer devices")
        per_device = self.hw.per_device_batch_size
        # The micro-batch is the preset's per-device batch, or the batch's share of each device where that is less.
        told = (f"hw.per_device_batch_size={micro}" if per_device in (None, micro) else
                f"{micro} example(s) per device (the batch's share; hw.per_device_batch_size={per_device} is the most)")
        _require(
            batch % (micro * world_size) == 0,
            f"train.batch_size={batch} must be a multiple of {told} x {world_size} device(s) = {micro * world_size}, "
            "so that gradient accumulation adds up to exactly the global batch; change one of them",
        )

    def _check_precision(self) -> None:
        dtype, hw = self.precision.dtype, self.hw
        if hw.accelerator != Accelerator.cuda:
            # auto resolves against the real device at run time (nli.runtime.device).
            return
        gpu = hw.gpu or "this GPU"
        _require(dtype != Precision.bf16 or hw.bf16,
                 f"precision=bf16 needs a GPU with bfloat16 (Ampere or newer); {gpu} has none. "
                 "Use precision=fp16 or precision=auto")
        _require(dtype != Precision.fp16 or hw.fp16,
                 f"precision=fp16 needs a GPU with float16 tensor cores (Volta or newer); {gpu} has "
                 "none. Use precision=fp32 or precision=auto")

    def _check_data_source(self) -> None:
        data, task = self.data, self.task
        _require(data.dir is None or not data.files, "set data.dir (a GLUE directory) or data.files "
                 "(files of your own), not both")
        _require(data.dir is None or task.glue is not None, f"data.dir reads the GLUE layout, which "
                 f"task={task.name} does not have; use data.files for your own files")
        _require(bool(data.files) or data.dir is not None or task.hub_dataset is not None or task.is_generated,
                 f"task={task.name} has no Hub dataset (task.hub_dataset); set data.files")
        _require(not data.columns or bool(data.files), "data.columns maps the columns of data.files; "
                 "set data.files too (a GLUE directory's columns are known)")
        self._check_columns()
        self._check_file_splits()
        _require(not self.train.predict or bool(task.test_splits),
                 f"train.predict=true needs a test split, and task={task.name} has none "
                 "(task.test_splits)")
        if data.files:
            train = [] if self.eval.only else [task.train_split]  # an evaluation-only run reads no training set
            needed = [*train, *task.eval_splits, *(task.test_splits if self.train.predict else [])]
            missing = [split for split in needed if split not in data.files]
            _require(not missing, f"data.files must name a file for the split(s) {missing} of "
                     f"task={task.name}: add +data.files.{missing[0] if missing else ''}=path/to/file.csv")

    def _check_file_splits(self) -> None:
        """Each key of data.files is a split of the task: another (dev, beside validation) was never read, and the run
        scored the split of the task's own name, or stopped for want of it, with no word of the key."""
        import difflib

        task = self.task
        known = [task.train_split, *task.eval_splits, *task.test_splits]
        for key in self.data.files:
            # GLUE names its validation files dev: the name a user brings from its folders
            near = [next(iter(task.eval_splits))] if key in ("dev", "val", "valid", "eval") else \
                difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            meant = f"did you mean data.files.{near[0]}? " if near else ""
            _require(key in known, f"data.files.{key} names no split of task={task.name}, so no run would read it: "
                     f"{meant}data.files takes {', '.join(known)}")

    def _check_columns(self) -> None:
        """Each key of data.columns is a column the task reads: a misspelt one (lable) was never read, and the run
        trained on the file's column of the task's own name, or stopped on one it lacked, with no word of the key."""
        import difflib

        task = self.task
        known = [*task.text_fields, *task.groups, "label"]
        for key in self.data.columns:
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            meant = f"did you mean data.columns.{near[0]}? " if near else ""
            _require(key in known, f"data.columns.{key} names no column task={task.name} reads, so nothing would read "
                     f"it: {meant}data.columns maps {', '.join(known)} to the files' columns")

    def _check_loggers(self) -> None:
        for name, logger in self.logger.items():
            if isinstance(logger, LoggerConfig):
                continue
            selected = [each for each, chosen in self.logger.items() if isinstance(chosen, LoggerConfig)]
            # `+logger.wandb.log_model=true` without logger=wandb: keys of a logger this run does not select.
            _require(not isinstance(logger, dict), unselected_logger(f"logger.{name}", name, selected))
            # `logger.mode=offline` (before several loggers at once) lands here as a plain value.
            _require(False, f"logger.{name}={logger!r} is not a logger: each logger has its own key, e.g. "
                     "logger=wandb logger.wandb.mode=offline")

    def micro_batch_size(self, world_size: int) -> int:
        """Examples one device processes per forward pass."""
        share = max(1, self.train.batch_size // world_size)
        per_device = self.hw.per_device_batch_size
        return share if per_device is None else min(per_device, share)

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each device."""
        return self.train.batch_size // (self.micro_batch_size(world_size) * world_size)


def config_dir() -> Path:
    """The config's folder: inside the package once installed (nli/conf), beside it in a source checkout."""
    package = Path(__file__).resolve().parents[1]
    return package / "conf" if (package / "conf").is_dir() else package.parent / "conf"


def task_config(name: str) -> TaskConfig:
    """The task ``conf/task/<name>.yaml`` defines, as ``task=<name>`` composes it: its defaults list
    names the TaskConfig schema, whose rules are checked."""
    path = config_dir() / "task" / f"{name}.yaml"
    try:
        node = OmegaConf.load(path)
        if not isinstance(node, DictConfig):
            raise ConfigError(f"{path}: a task file holds a mapping of keys, not a list")
        node.pop("defaults", None)  # it names the schema, TaskConfig, as Hydra composes the file
        return cast(TaskConfig, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TaskConfig), node)))
    except (OSError, OmegaConfBaseException) as err:
        raise ConfigError(f"{path}: task {name} cannot be read: {err}") from None


def checked(cfg: Config) -> Config:
    """``cfg`` as a run takes it, checked again: a config composed by :func:`compose` may have been edited since.
    Each attribute set must be a field of its schema (``cfg.train.epocs = 7`` was ignored: a dataclass takes any
    attribute), each value of its field's type, and every rule must hold (``cfg.optimizer.lr = -1`` failed deep in
    torch). Returns a copy; ``cfg`` is left as it is."""
    import dataclasses

    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _check_attributes(cfg, "")
    try:
        structured = OmegaConf.structured(cfg)
    except OmegaConfBaseException as err:  # a value of another type: OmegaConf names the key
        raise ConfigError(f"the config was edited with a value its key does not take: {str(err).splitlines()[0]}") \
            from None
    fresh = cast(Config, OmegaConf.to_object(structured))  # each node's __post_init__: the schema's rules
    assert dataclasses.is_dataclass(fresh)
    return fresh


def job_refusal(cfg: DictConfig) -> Optional[str]:
    """Why a job's composed config (its ``hydra`` node included) would stop the job as it starts: a key no schema
    knows, a value or a combination the rules refuse, in the line the job would say; None where it passes, where
    the job evaluates a run folder (its config comes from the folder, and it checks itself as it starts) and where
    the config is not this schema's (another app's, under a launcher). ``cfg`` is left as it was. Asked of each
    trial by the Optuna sweeper before it launches it (nli.sweep.search: trials are drawn as the search goes, past
    the command line's check), and of each job by the Vertex launcher before it starts a machine for it."""
    if OmegaConf.get_type(cfg) is not Config:
        return None
    task = copy.deepcopy(cfg)
    with open_dict(task):
        task.pop("hydra", None)
    try:
        given = OmegaConf.select(cfg, "model.name_or_path")
        if OmegaConf.select(cfg, "eval.only") and given and runfolder.locate(str(given)) is not None:
            return None  # an evaluation of a run folder; one of another path is checked as it is
        built(task)  # each node's __post_init__: the rules
    except ConfigError as err:
        return str(err)
    except OmegaConfBaseException as err:  # a value its key does not take: OmegaConf's first line names both
        return str(err).splitlines()[0]
    return None


def _check_attributes(node: Any, path: str) -> None:
    """Every attribute of the dataclass ``node`` (at ``path``) and of those under it is a field of its schema."""
    import dataclasses
    import difflib

    if not dataclasses.is_dataclass(node):
        if isinstance(node, dict):
            for name, value in node.items():
                _check_attributes(value, f"{path}{name}.")
        return
    known = [each.name for each in dataclasses.fields(node)]
    for name, value in vars(node).items():
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            meant = f"did you mean {path}{near[0]}? " if near else ""
            raise ConfigError(f"{path}{name} was set on the config, and it is no key of it, so nothing would read it: "
                              f"{meant}{path.rstrip('.') or 'the top level'} takes {', '.join(known)}")
        _check_attributes(value, f"{path}{name}.")


def register_configs() -> None:
    """Put every schema into Hydra's ConfigStore under the ``schema/`` group.

    The YAML files extend them with ``- /schema/<group>@_here_: <name>`` in their defaults list,
    which keeps the schemas out of each group's list of options.
    """
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for group, name, node in [
        ("model", "base", ModelConfig),
        ("model/peft", "lora", LoraConfig),
        ("task", "base", TaskConfig),
        ("optimizer", "adam", AdamConfig),
        ("optimizer", "sgd", SGDConfig),
        ("schedule", "base", ScheduleConfig),
        ("precision", "base", PrecisionConfig),
        ("hw", "base", HardwareConfig),
        ("logger", "wandb", WandbConfig),
        ("logger", "tensorboard", TensorBoardConfig),
        ("logger", "csv", CsvConfig),
    ]:
        cs.store(group=f"schema/{group}", name=name, node=node)
