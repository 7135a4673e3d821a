"""One Hydra job -> one CustomJob request (plain JSON-able dicts in the API's field names).

The job runs the app's own entry point with the job's overrides, plus the Hydra settings that make
the remote run this job: its config name, its output directory, and the callback that reads the
job's secrets and reports its return value."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, cast

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from nli.contract import VERTEX_JOB_RETURN_FILE, job_needs

from .config import VertexLauncherConf

CALLBACK = "hydra_plugins.vertex_launcher._callback.VertexJobCallback"
SECRETS_VARIABLE = "VERTEX_LAUNCHER_SECRETS"  # NAME -> secret version, as JSON; read by the callback
JOB_RETURN_FILE = VERTEX_JOB_RETURN_FILE  # written by the callback into the job's output directory
REPORTED_BY = "job_id"  # its key naming the CustomJob (its ID) that wrote it
MAX_LABELS = 64
_LABEL_CHARS = re.compile(r"[^a-z0-9_-]")
# Hydra settings of the sweep that mean nothing inside a single remote run.
_SWEEP_ONLY = ("hydra/launcher", "hydra.launcher", "hydra/sweeper", "hydra.sweeper", "hydra.sweep", "hydra.mode",
               "hydra.run.dir", "hydra.callbacks.vertex_job")


@dataclass(frozen=True)
class Machine:
    machine_type: str
    accelerator_type: Optional[str]  # e.g. NVIDIA_TESLA_A100, or TPU_V3 on cloud-tpu; null: none
    accelerator_count: int  # GPUs, or TPU cores on cloud-tpu, per machine
    tpu_topology: Optional[str]  # a TPU VM's chips (ct5lp-hightpu-8t: 2x4); null: not a TPU VM
    nodes: int  # machines of this kind: the primary and nodes - 1 more workers


def machine(cfg: DictConfig, settings: VertexLauncherConf) -> Machine:
    """The machines the job's config asks for (nli.contract); the launcher's default where it names none."""
    needs = job_needs(cfg)
    return Machine(needs.machine_type or settings.machine_type, needs.accelerator_type, needs.accelerators_per_node,
                   needs.tpu_topology, needs.nodes)


def machine_spec(hw: Machine) -> Dict[str, Any]:
    """The API's MachineSpec, with only the fields that apply: a GPU or cloud-tpu machine names its
    accelerators, a TPU VM (ct5lp-hightpu-*) its topology and no accelerator, a CPU machine neither."""
    spec: Dict[str, Any] = {"machine_type": hw.machine_type}
    if hw.accelerator_type:
        spec.update(accelerator_type=hw.accelerator_type, accelerator_count=hw.accelerator_count)
    if hw.tpu_topology:
        spec["tpu_topology"] = hw.tpu_topology
    return spec


def container_args(sweep_config: DictConfig, overrides: List[str], run_dir: str) -> List[str]:
    """What the entry point gets: the job's config name and overrides, then Hydra settings."""
    hydra_cfg = sweep_config.hydra
    passed = [line for line in cast(List[Any], OmegaConf.to_container(hydra_cfg.overrides.hydra)) if _keep(str(line))]
    return [f"--config-name={hydra_cfg.job.config_name}", *overrides, *passed,
            f"hydra.run.dir={quote(run_dir)}", f"+hydra.callbacks.vertex_job._target_={CALLBACK}"]


def quote(value: str) -> str:
    """A Hydra override value that stays one string whatever it holds (`a=1,b=2` is not a sweep)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _keep(line: str) -> bool:
    key = OverridesParser.create().parse_override(line).key_or_group
    return not key.startswith(_SWEEP_ONLY)


def labels(sweep_name: str, job_num: int, overrides: List[str], extra: Dict[str, str]) -> Dict[str, str]:
    """Labels to find and group the jobs by in the console and billing: the sweep, the job number and
    each override (`optimizer.lr=1e-5` -> optimizer_lr: 1e-5), cleaned to Google's label rules."""
    found = {"hydra_sweep": label_value(sweep_name), "hydra_job": str(job_num)}
    for override in OverridesParser.create().parse_overrides(overrides):
        if len(found) < MAX_LABELS - len(extra):
            found[label_key(override.key_or_group)] = label_value(override.get_value_element_as_str())
    found.update({label_key(key): label_value(value) for key, value in extra.items()})
    return found


def label_key(text: str) -> str:
    key = _LABEL_CHARS.sub("_", text.lower().lstrip("+~"))
    return (key if key[:1].isalpha() else f"k{key}")[:63]


def label_value(text: str) -> str:
    return _LABEL_CHARS.sub("_", text.lower())[:63]


def display_name(sweep_name: str, job_num: int, overrides: List[str]) -> str:
    """Unique in the sweep, readable in the console's job list (at most 128 characters)."""
    return f"{sweep_name}-{job_num} {' '.join(overrides)}".strip()[:128]


@dataclass(frozen=True)
class Code:
    """What a job runs: the uploaded package (a Python-package job's), the container image (settings.image_uri
    when None), and the variables that say what it runs, set after the user's own, which cannot change them."""

    package_uri: Optional[str] = None
    image_uri: Optional[str] = None
    provenance: Dict[str, str] = field(default_factory=dict)


def custom_job(*, settings: VertexLauncherConf, cfg: DictConfig, name: str, job_labels: Dict[str, str],
               args: List[str], output_dir: str, code: Code) -> Dict[str, Any]:
    """The CustomJob resource, in the API's (snake_case) field names."""
    hw = machine(cfg, settings)
    pool: Dict[str, Any] = {"machine_spec": machine_spec(hw), "replica_count": 1}
    env = [{"name": key, "value": value} for key, value in {**settings.env, **code.provenance}.items()]
    if settings.secrets:  # references only: the job resolves them with its own service account
        env.append({"name": SECRETS_VARIABLE, "value": json.dumps(dict(settings.secrets), sort_keys=True)})
    if not settings.python_package():
        pool["container_spec"] = {"image_uri": code.image_uri or settings.image_uri, "args": args, "env": env}
    else:
        pool["python_package_spec"] = {"executor_image_uri": settings.executor_image_uri,
                                       "package_uris": [code.package_uri], "python_module": settings.python_module,
                                       "args": args, "env": env}
    job_spec: Dict[str, Any] = {"worker_pool_specs": _pools(pool, hw.nodes, settings),
                                "base_output_directory": {"output_uri_prefix": output_dir},
                                "scheduling": _scheduling(settings)}
    if settings.service_account:
        job_spec["service_account"] = settings.service_account
    if settings.network:
        job_spec["network"] = settings.network
    if settings.tensorboard:
        job_spec["tensorboard"] = settings.tensorboard
    return {"display_name": name, "labels": job_labels, "job_spec": job_spec}


def _pools(primary: Dict[str, Any], nodes: int, settings: VertexLauncherConf) -> List[Dict[str, Any]]:
    """Vertex AI's worker pools: 0, the primary (one replica, the rendezvous host); 1, the other nodes
    (same machine and code); 2, Reduction Server's CPU replicas, when asked for."""
    pools = [primary]
    if nodes > 1 or settings.reduction_server_replicas:
        pools.append({**primary, "replica_count": nodes - 1} if nodes > 1 else {})  # an empty pool keeps the index
    if settings.reduction_server_replicas:
        pools.append({"machine_spec": {"machine_type": settings.reduction_server_machine_type},
                      "replica_count": settings.reduction_server_replicas,
                      "container_spec": {"image_uri": settings.reduction_server_image_uri}})
    return pools


def _scheduling(settings: VertexLauncherConf) -> Dict[str, Any]:
    scheduling: Dict[str, Any] = {"strategy": settings.strategy.value,
                                  "restart_job_on_worker_restart": settings.restart_job_on_worker_restart}
    if settings.timeout:
        scheduling["timeout"] = f"{settings.timeout}s"
    return scheduling


def tensorboard_url(tensorboard: str, job_name: str) -> str:
    """The Vertex AI TensorBoard page of a job's experiment (named after the job's id), as the
    aiplatform SDK links it."""
    region = tensorboard.split("/")[3]
    experiment = f"{tensorboard}/experiments/{job_name.rsplit('/', 1)[-1]}".replace("/", "+")
    return f"https://{region}.tensorboard.googleusercontent.com/experiment/{experiment}"
