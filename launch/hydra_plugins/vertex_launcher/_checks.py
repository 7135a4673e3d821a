"""Checks that run before anything is submitted (or saved): the settings, the machines each job asks
for, and that no secret value travels in a job's spec, where anyone who can view the job could read it."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from typing import Any, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

from hydra.errors import CompactHydraException
from omegaconf import DictConfig

from nli.contract import HW_GROUP, job_needs
from nli.errors import StorageError, UserError
from nli.io.storage import Storage

from ._spec import Machine, machine
from .config import VertexLauncherConf

# Variables that hold credentials: never passed by value. `hydra.launcher.secrets` adds its own names.
SECRET_NAMES = frozenset({"WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
_SECRET_VERSION = re.compile(r"^projects/[^/]+/secrets/[^/]+/versions/[^/]+$")
# Where a user keeps the settings every sweep of theirs shares (conf/hydra/launcher/vertex.yaml reads it).
_YOURS = "; once for every sweep: in conf/local/vertex.yaml (docs/vertex.md, Your defaults)"
_PRICES = "hydra.launcher.prices"
_TENSORBOARD = re.compile(r"^projects/[^/]+/locations/(?P<region>[^/]+)/tensorboards/[^/]+$")


class LaunchError(CompactHydraException, UserError):
    """A sweep that cannot start as configured; the message says what to change (Hydra prints it alone,
    without a traceback, and exits 1)."""


class Refused(SystemExit):
    """A LaunchError as the launcher raises it to Hydra: ``error: <message>`` on stderr and exit status 1,
    as the app's own refusals end (nli.cli). Not an Exception, which Hydra would print under a traceback,
    or (a CompactHydraException) followed by a line offering the traceback there is no use for."""

    def __init__(self, error: LaunchError) -> None:
        super().__init__(f"error: {error}")


def check_settings(settings: VertexLauncherConf) -> None:
    """Everything the launcher can check from its own settings, with the fix in each message."""
    _require(settings.project, "hydra.launcher.project",
             f"hydra.launcher.project=MY_PROJECT (or gcloud config set project MY_PROJECT){_YOURS}")
    _require(settings.staging_bucket, "hydra.launcher.staging_bucket",
             f"hydra.launcher.staging_bucket=gs://MY_BUCKET{_YOURS}")
    if not str(settings.staging_bucket).startswith("gs://"):
        raise LaunchError(f"hydra.launcher.staging_bucket={settings.staging_bucket} is not a gs:// path")
    if not str(settings.staging_bucket)[len("gs://"):].partition("/")[0]:
        raise LaunchError(f"hydra.launcher.staging_bucket={settings.staging_bucket} names no bucket: "
                          "write gs://MY_BUCKET[/PREFIX]")
    if settings.build:
        _check_build(settings)
    elif not settings.python_package():
        _require(settings.image_uri, "hydra.launcher.image_uri",
                 "hydra.launcher.image_uri=REGION-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG "
                 "(see docs/vertex.md), hydra.launcher.build=true, or hydra.launcher.packaging=python_package"
                 f"{_YOURS}")
    if settings.max_concurrent_jobs < 1 or settings.poll_interval <= 0 or settings.failed_log_lines < 0:
        raise LaunchError("hydra.launcher.max_concurrent_jobs must be >= 1, poll_interval > 0 and "
                          "failed_log_lines >= 0")
    if settings.timeout is not None and settings.timeout <= 0:  # Vertex AI would take "-5s" as its request's
        raise LaunchError(f"hydra.launcher.timeout={settings.timeout} must be a positive number of seconds, or null "
                          "for Vertex AI's default (7 days)")
    for name, version in settings.secrets.items():
        if not _SECRET_VERSION.match(version):
            raise LaunchError(f"hydra.launcher.secrets.{name}={version} is not a Secret Manager version: "
                              "write projects/PROJECT/secrets/NAME/versions/latest")
    _check_env(settings)
    if settings.tensorboard:
        _check_tensorboard(settings)
    check_prices(settings)


def check_bucket(settings: VertexLauncherConf) -> None:
    """The staging bucket exists: else the launcher's record of the sweep cannot be written, and each job fails
    on its machine, started only for that. One probe object, written and removed (nli.io.storage)."""
    from google.api_core.exceptions import NotFound

    try:
        Storage(str(settings.staging_bucket), key="hydra.launcher.staging_bucket").check_writable()
    except StorageError as error:
        # Only a missing bucket stops the sweep: your credentials may be refused where the jobs' service account
        # may write, and the launcher's own writes say so, one warning each.
        if isinstance(error.__cause__, NotFound):
            raise LaunchError(f"{error}; nothing was built or submitted") from None


def check_prices(settings: VertexLauncherConf) -> None:
    """Every key of the price table is one it knows: a ``+`` override adds any key to a typed node, and a
    misspelt price (``spto``) would be left unread while the estimate used the table's."""
    unknown = _extra_keys(settings.prices, _PRICES)
    for table in ("machines", "accelerators"):
        for name, entry in getattr(settings.prices, table).items():
            where = f"{_PRICES}.{table}.{name}"
            unknown += _extra_keys(entry, where) if dataclasses.is_dataclass(entry) else [where]
            for key in ("on_demand", "spot"):
                value = getattr(entry, key, None)
                if value is not None and float(value) < 0:
                    raise LaunchError(f"{where}.{key}={value}: a price per hour cannot be negative")
    if unknown:
        raise LaunchError(f"{', '.join(unknown)}: not a key of the price table (a machine's or accelerator's "
                          f"price has on_demand and spot; {_PRICES} has region, read_on, machines, accelerators)")


def _extra_keys(node: Any, where: str) -> List[str]:
    """Attributes of a dataclass that are not its fields: what OmegaConf.to_object set from an added key."""
    fields = {each.name for each in dataclasses.fields(node)}
    return [f"{where}.{key}" for key in vars(node) if key not in fields]


_REPOSITORY = re.compile(r"[a-z0-9-]+-docker\.pkg\.dev/[^/:@]+/[^/:@]+/[^:@]+")


def _check_build(settings: VertexLauncherConf) -> None:
    """build=true builds a container image and names it itself."""
    if settings.python_package():
        raise LaunchError("hydra.launcher.build=true builds the container image; it needs "
                          "hydra.launcher.packaging=container")
    if settings.image_uri:
        raise LaunchError(f"hydra.launcher.image_uri={settings.image_uri} and hydra.launcher.build=true: pass one. "
                          "build=true names the image it builds (set where with hydra.launcher.build_repository)")
    if settings.build_repository and not _REPOSITORY.fullmatch(settings.build_repository.rstrip("/")):
        raise LaunchError(f"hydra.launcher.build_repository={settings.build_repository} is not an Artifact Registry "
                          "image: write REGION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE, without a tag")
    own = sorted(set(settings.build_substitutions) & {"_IMAGE", "_TAG"})
    if own:
        raise LaunchError(f"hydra.launcher.build_substitutions.{own[0]} is set by the launcher (the image's name and "
                          "its content tag): use hydra.launcher.build_repository for where it goes")


def _check_tensorboard(settings: VertexLauncherConf) -> None:
    """Vertex AI's rules for a CustomJob's TensorBoard, before a job is refused for them."""
    match = _TENSORBOARD.match(str(settings.tensorboard))
    if not match:
        raise LaunchError(f"hydra.launcher.tensorboard={settings.tensorboard} is not a TensorBoard's resource name: "
                          "write projects/PROJECT/locations/REGION/tensorboards/ID (gcloud ai tensorboards list)")
    if match["region"] != settings.region:
        raise LaunchError(f"hydra.launcher.tensorboard is in {match['region']} and the jobs run in {settings.region}: "
                          f"Vertex AI needs both in one region (hydra.launcher.region={match['region']}, or a "
                          f"TensorBoard in {settings.region})")
    if not settings.service_account:
        raise LaunchError("hydra.launcher.tensorboard needs hydra.launcher.service_account=NAME@PROJECT.iam."
                          "gserviceaccount.com: Vertex AI uploads a job's events to a TensorBoard only when the job "
                          "runs as a service account of yours, with roles/storage.admin on the staging bucket and "
                          "roles/aiplatform.user")


@dataclass(frozen=True)
class TpuMachine:
    """What Vertex AI takes with one of its TPU machine types, on one host."""

    accelerator_types: Tuple[str, ...]  # the accelerator_type it takes; (): none
    accelerator_count: int  # with each of them; 0: none
    topology: Optional[str]  # the tpu_topology of its chips; None: it takes none

    def accelerators(self) -> FrozenSet[Tuple[Optional[str], int]]:
        """The (accelerator_type, accelerator_count) pairs it takes; a TPU VM takes (None, 0) only."""
        return frozenset((name, self.accelerator_count) for name in self.accelerator_types) or frozenset({(None, 0)})


# The TPU machines this launcher runs a job on, one host each (it builds no multi-host slices): the TPU
# Node machine of v2-8 and v3-8, sized by its accelerator (8 TensorCores), and the v5e TPU VMs, sized
# by their machine type's chips (the -Nt suffix), which the topology must match.
TPU_MACHINES = {
    "cloud-tpu": TpuMachine(("TPU_V2", "TPU_V3"), 8, None),
    "ct5lp-hightpu-1t": TpuMachine((), 0, "1x1"),
    "ct5lp-hightpu-4t": TpuMachine((), 0, "2x2"),
    "ct5lp-hightpu-8t": TpuMachine((), 0, "2x4"),
}
_TOPOLOGY = re.compile(r"\d+(x\d+)+")


def check_machines(settings: VertexLauncherConf, configs: Iterable[DictConfig], presets: Sequence[str] = ()) -> None:
    """The machine spec of every job (nli.contract.job_needs): a job that names no machine, one Vertex AI
    would refuse, a TPU job that could not run, or a machine that cannot train the job yet stops the sweep
    before anything is submitted. ``presets``: the options of the app's hw group, for the message."""
    for cfg in configs:
        _check_chosen(cfg, presets)
        hw = machine(cfg, settings)
        tpu = TPU_MACHINES.get(hw.machine_type)
        problem = next(_not_tpu_problems(hw) if tpu is None else _tpu_problems(hw, tpu, settings), None)
        if problem:
            raise LaunchError(problem)
        if (why := job_needs(cfg).cannot_train) is not None:  # after the spec's problems: theirs is the fix
            raise LaunchError(f"{HW_GROUP}={job_needs(cfg).hw_option} cannot train yet: {why}. Pick a machine that "
                              f"can ({HW_GROUP}=tpu-v5e-8, {HW_GROUP}=a100)")


def _check_chosen(cfg: DictConfig, presets: Sequence[str]) -> None:
    """A job of an app with a hw group runs on the machine its option names: one that names none (hw=auto:
    whatever the machine has) would get the launcher's default machine, a CPU, and train there for hours."""
    needs = job_needs(cfg)
    if needs.hw_option is None or needs.machine_type is not None:
        return
    named = ", ".join(option for option in presets if option != needs.hw_option)
    raise LaunchError(f"{HW_GROUP}={needs.hw_option} names no machine, and on Vertex AI a job runs on the machine its "
                      f"{HW_GROUP} option names (else a CPU). Pick one: {HW_GROUP}=a100, say "
                      f"({HW_GROUP} options: {named}); {HW_GROUP}=cpu asks for a CPU job on purpose")


def _not_tpu_problems(hw: Machine) -> Iterator[str]:
    if hw.tpu_topology:
        yield (f"hw.vertex.tpu_topology={hw.tpu_topology} on machine type {hw.machine_type}: only the TPU VM machine "
               f"types ({', '.join(name for name, tpu in TPU_MACHINES.items() if tpu.topology)}) take a topology; "
               "set hw.vertex.tpu_topology=null, or pick a TPU preset (hw=tpu-v5e-8)")
    if (hw.accelerator_type or "").startswith("TPU_"):
        yield (f"hw.vertex.accelerator_type={hw.accelerator_type} on machine type {hw.machine_type}: TPU v2 and v3 "
               "run on machine type cloud-tpu; set hw.vertex.machine_type=cloud-tpu (hw=tpu-v3-8, hw=tpu-v2-8)")


def _tpu_problems(hw: Machine, tpu: TpuMachine, settings: VertexLauncherConf) -> Iterator[str]:
    where = f"a TPU (machine type {hw.machine_type})"
    if (hw.accelerator_type, hw.accelerator_count) not in tpu.accelerators():
        got = f"{hw.accelerator_type} x {hw.accelerator_count}" if hw.accelerator_type else "none"
        yield (f"machine type {hw.machine_type} needs hw.vertex.accelerator_type={' or '.join(tpu.accelerator_types)} "
               f"and hw.vertex.accelerator_count={tpu.accelerator_count}, not {got}: set both (hw=tpu-v3-8 does)"
               if tpu.accelerator_types else
               f"machine type {hw.machine_type} is a TPU VM, sized by hw.vertex.tpu_topology, and takes no "
               f"accelerator, not {got}: set hw.vertex.accelerator_type=null")
    if tpu.topology is None and hw.tpu_topology:
        yield (f"machine type {hw.machine_type} takes no tpu_topology (its accelerator count is its size): "
               "set hw.vertex.tpu_topology=null")
    if tpu.topology and _chips(hw.tpu_topology) != _chips(tpu.topology):
        yield (f"machine type {hw.machine_type} needs hw.vertex.tpu_topology={tpu.topology} (as many chips as the "
               f"machine has), not {hw.tpu_topology or 'none'}")
    if hw.nodes > 1:
        yield (f"hw.nodes={hw.nodes} with {where}: this launcher runs a TPU job on one host and builds no "
               "multi-host slices; set hw.nodes=1")
    if settings.reduction_server_replicas > 0:
        yield (f"hydra.launcher.reduction_server_replicas={settings.reduction_server_replicas} with {where}: "
               "Reduction Server speeds up NCCL's all-reduce between GPU machines and does nothing on a TPU; "
               "set hydra.launcher.reduction_server_replicas=0")
    if settings.python_package():
        yield (f"hydra.launcher.packaging=python_package with {where}: Vertex AI's prebuilt PyTorch images have no "
               "torch-xla; build the TPU image (docker build --target tpu, see docs/tpu.md) and pass "
               "hydra.launcher.packaging=container hydra.launcher.image_uri=IMAGE")


def _chips(topology: Optional[str]) -> Optional[int]:
    """2x4 -> 8 chips; None for no topology or one that is not NxM[xK]."""
    if not topology or not _TOPOLOGY.fullmatch(topology):
        return None
    return math.prod(int(side) for side in topology.split("x"))


def secret_names(settings: VertexLauncherConf) -> frozenset[str]:
    return SECRET_NAMES | frozenset(settings.secrets)


def _check_env(settings: VertexLauncherConf) -> None:
    names = secret_names(settings)
    # A secret's value, however it got into `env` (typed, or through ${oc.env:...}), must not be sent.
    values = {os.environ[name] for name in names if os.environ.get(name)}
    for name, value in settings.env.items():
        if name in names or value in values:
            raise LaunchError(
                f"hydra.launcher.env.{name} would put a secret into the job's spec, which anyone who can "
                f"view the job can read. Store it in Secret Manager and pass it by reference: "
                f"hydra.launcher.secrets='{{{name if name in names else 'NAME'}: "
                f"projects/PROJECT/secrets/SECRET/versions/latest}}' (see docs/vertex.md, Secrets)")


def check_secrets(settings: VertexLauncherConf, configs: Iterable[DictConfig]) -> None:
    """Every secret a job needs (nli.contract.job_needs: an online W&B logger needs WANDB_API_KEY) must
    reach it as a secret, the only way in that anyone who can view the job cannot read."""
    for cfg in configs:
        for name in sorted(job_needs(cfg).secrets - set(settings.secrets)):
            raise LaunchError(f"{_WHY.get(name, f'the job needs {name}')}, and a job's environment is visible to "
                              "anyone who can view it. Store it in Secret Manager once:\n"
                              f"  printf %s \"${name}\" | gcloud secrets create {_secret_id(name)} --data-file=-\n"
                              f"  gcloud secrets add-iam-policy-binding {_secret_id(name)} "
                              "--member=serviceAccount:JOB_SERVICE_ACCOUNT --role=roles/secretmanager.secretAccessor\n"
                              f"then pass hydra.launcher.secrets='{{{name}: "
                              f"projects/{settings.project}/secrets/{_secret_id(name)}/versions/latest}}'"
                              f"{_INSTEAD.get(name, '')}")


# A null logger.wandb.mode is online in the job: the launching shell's WANDB_MODE does not reach it.
_WHY = {"WANDB_API_KEY": "logger=wandb logs online (logger.wandb.mode=online, or unset: the job does not see your "
                         "shell's WANDB_MODE) and needs WANDB_API_KEY in each job"}
_INSTEAD = {"WANDB_API_KEY": " (or use logger.wandb.mode=offline)"}


def _secret_id(name: str) -> str:
    return name.lower().replace("_", "-")


def _require(value: object, name: str, how: str) -> None:
    if not value:
        raise LaunchError(f"{name} is not set: pass {how}")
