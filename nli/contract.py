"""What a run and the launchers that start it agree on, written down once.

A run writes into its output directory (the Hydra run directory, ``output_dir=``, or the one its
platform gives it: on Vertex AI, ``AIP_MODEL_DIR``):

- ``config.yaml``: the resolved config, and ``overrides.yaml``: the command's overrides, as typed (both
  written once the run is accepted into the folder and has loaded what it needs, so that a command refused,
  or failing as it loads, changes neither);
- ``results.json``: one JSON object, the final metrics with ``objective`` and ``status`` (flat but for
  ``provenance``, an object, and ``warnings``, a list),
  written last, so that its presence means the run finished;
- ``model/``: the best model and its tokenizer (``save_pretrained``), its model card ``README.md``, and
  ``export.json``, the step and evaluation of those weights (written as soon as a checkpoint becomes
  the best, and at the end);
- ``predictions/``, and ``checkpoints/`` unless the platform names another checkpoint directory;
- ``evaluations.jsonl``: each evaluation's step and objective so far, one JSON object a line, for a search
  that judges the run while it trains (nli.sweep.pruning); where that search writes ``prune.json`` into
  the folder, training ends at its next evaluation as early stopping ends it, and results.json's
  ``status`` is ``pruned``.

A run stopped by a signal after writing its checkpoint exits with ``PREEMPTED``; started again with
the same output directory, it continues.

The Vertex AI launcher (``hydra_plugins.vertex_launcher``) gives each job a base output directory;
Vertex AI derives the job's directories from it (:func:`vertex_dirs`), the run writes there, and the
launcher reads ``results.json`` back from the model directory. Before it submits a job, the launcher
asks :func:`job_needs` what machines and secrets the job's config asks for, so that it reads no
key of the app's config itself.

Light on purpose (no torch): the launcher imports it while Hydra starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional

from omegaconf import DictConfig, OmegaConf

CLAIM_FILE = ".claim.json"  # a run's hold on its folder while it runs (nli.io.claim)
CONFIG_FILE = "config.yaml"
OVERRIDES_FILE = "overrides.yaml"  # the overrides the run was started with, as typed
RESULTS_FILE = "results.json"
MULTIRUN_RECORD = "multirun.yaml"  # what Hydra writes at the top of a sweep's folder
MODEL_DIR = "model"
EXPORT_FILE = "export.json"  # in model/: the step and evaluation of the exported weights
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_NAME = re.compile(r"^step-(\d+)$")  # a checkpoint's folder in checkpoints/: step-000120
CHECKPOINT_MANIFEST = "checkpoint.json"  # in checkpoints/step-N, written last: a checkpoint without it is unfinished
PREDICTIONS_DIR = "predictions"
EVAL_PREDICTIONS_DIR = "eval_predictions"  # each eval example's prediction (nli.evaluate.per_class)
CLASS_FIGURES = ("precision", "recall", "f1", "support")  # each class's, under results.json's per_class
EVALUATIONS_FILE = "evaluations.jsonl"  # each evaluation's step and objective, as training goes
PRUNE_FILE = "prune.json"  # written by a search's sweeper: end training at the next evaluation
COMPLETED, PRUNED = "completed", "pruned"  # results.json's status: trained to the end (or stopped early), or pruned
PREEMPTED = 75  # exit status of a run stopped by a signal after its checkpoint (EX_TEMPFAIL: retry)

# What Vertex AI sets in a CustomJob's environment, from the job's base output directory.
VERTEX_MODEL_DIR = "AIP_MODEL_DIR"
VERTEX_CHECKPOINT_DIR = "AIP_CHECKPOINT_DIR"
VERTEX_TENSORBOARD_DIR = "AIP_TENSORBOARD_LOG_DIR"
VERTEX_CLUSTER_SPEC = "CLUSTER_SPEC"
VERTEX_JOB_ID = "CLOUD_ML_JOB_ID"  # the CustomJob's ID, the last part of its resource name
# What the launcher's jobs and the launcher write into a sweep's folders in the bucket: each job's
# return value or error (in its model directory), and the record of the sweep's jobs (nli.sweep.vertex).
VERTEX_JOB_RETURN_FILE = "job_return.json"
VERTEX_JOBS_FILE = "vertex_jobs.json"

# What the Vertex launcher tells each job about its code: an image holds no .git, so a job names its
# commit (and whether the launching checkout had uncommitted changes) and its image from these.
JOB_IMAGE = "NLI_IMAGE_URI"
JOB_COMMIT = "NLI_GIT_COMMIT"
JOB_DIRTY = "NLI_GIT_DIRTY"  # "true" or "false"


def vertex_dirs(base_output_directory: str) -> Dict[str, str]:
    """The variables Vertex AI sets for a job given ``base_output_directory`` (its documented layout)."""
    base = base_output_directory.rstrip("/")
    return {VERTEX_MODEL_DIR: f"{base}/model", VERTEX_CHECKPOINT_DIR: f"{base}/checkpoints",
            VERTEX_TENSORBOARD_DIR: f"{base}/logs"}


@dataclass(frozen=True)
class JobNeeds:
    """What one job's config asks a launcher for."""

    machine_type: Optional[str]  # the Vertex AI machine type of every node; None: the launcher's default
    accelerator_type: Optional[str]  # e.g. NVIDIA_TESLA_A100; None: CPU only
    accelerators_per_node: int  # GPUs (or TPU cores, chips) on each node
    tpu_topology: Optional[str]  # a TPU VM slice's topology, e.g. 2x4 (ct5lp-hightpu-8t); None otherwise
    nodes: int  # machines that run the job together
    secrets: FrozenSet[str]  # environment variables the job cannot run without (read from a secret store)
    hw_option: Optional[str] = None  # the option of the HW_GROUP it chose (hw=a100); None: the app has no such group
    cannot_train: Optional[str] = None  # why the machine it asks for cannot train it yet; None: it can


HW_GROUP = "hw"  # the config group whose option names a job's machine (conf/hw/)
# TPU generations a run cannot train on yet, and why (nli.runtime.xla refuses them at start, on the machine).
UNTRAINABLE_TPUS = dict.fromkeys(
    ("v2", "v3"), "PyTorch/XLA runs each chip's two TensorCores as threads of one process, and a run is one "
                  "process (its config, signals and output folder are the process's)")


def job_needs(cfg: DictConfig) -> JobNeeds:
    """The machines (``hw``, ``hw.vertex``) and secrets (an online W&B logger needs its API key) the
    job's config asks for. Keys the config lacks (another app) ask for nothing."""
    accelerator = OmegaConf.select(cfg, "hw.vertex.accelerator_type")
    count = OmegaConf.select(cfg, "hw.vertex.accelerator_count", default=None)
    if count is None:
        count = OmegaConf.select(cfg, "hw.gpus_per_node", default=0) or 0
    return JobNeeds(machine_type=OmegaConf.select(cfg, "hw.vertex.machine_type"), accelerator_type=accelerator,
                    accelerators_per_node=int(count) if accelerator else 0,
                    tpu_topology=OmegaConf.select(cfg, "hw.vertex.tpu_topology", default=None),
                    nodes=int(OmegaConf.select(cfg, "hw.nodes", default=1) or 1),
                    secrets=frozenset({"WANDB_API_KEY"} if _wandb_online(cfg) else ()),
                    hw_option=OmegaConf.select(cfg, f"hydra.runtime.choices.{HW_GROUP}", default=None),
                    cannot_train=_cannot_train(cfg))


def _cannot_train(cfg: DictConfig) -> Optional[str]:
    accelerator = OmegaConf.select(cfg, "hw.accelerator", default=None)
    if str(getattr(accelerator, "value", accelerator)) != "xla":
        return None
    tpu = OmegaConf.select(cfg, "hw.tpu", default=None)
    return f"TPU {tpu}: {UNTRAINABLE_TPUS[tpu]}" if tpu in UNTRAINABLE_TPUS else None


# The modes in which W&B logs without its server (wandb's Settings._offline and _noop); every other
# mode (online, shared, run) logs to it and needs the key.
_WANDB_WITHOUT_SERVER = frozenset({"offline", "dryrun", "disabled"})


def _wandb_online(cfg: DictConfig) -> bool:
    """Whether the job's W&B logger, if it has one, logs online. ``logger.wandb.mode=null`` leaves the
    mode to WANDB_MODE in the job's own environment, which the launching shell's does not reach: only
    ``hydra.launcher.env.WANDB_MODE`` puts it there; without it, W&B's default, online."""
    if OmegaConf.select(cfg, "logger.wandb") is None:
        return False
    mode = OmegaConf.select(cfg, "logger.wandb.mode")  # an enum member in a typed config
    if mode is None:
        mode = OmegaConf.select(cfg, "hydra.launcher.env.WANDB_MODE", default=None) or "online"
    return str(getattr(mode, "value", mode)) not in _WANDB_WITHOUT_SERVER
