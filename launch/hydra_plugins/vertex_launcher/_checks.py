"""Checks that run before anything is submitted (or saved): the settings, and that no secret value
travels in a job's spec, where anyone who can view the job could read it."""

from __future__ import annotations

import os
import re
from typing import Iterable

from omegaconf import DictConfig

from nli.contract import job_needs

from .config import VertexLauncherConf

# Variables that hold credentials: never passed by value. `hydra.launcher.secrets` adds its own names.
SECRET_NAMES = frozenset({"WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
_SECRET_VERSION = re.compile(r"^projects/[^/]+/secrets/[^/]+/versions/[^/]+$")
_TENSORBOARD = re.compile(r"^projects/[^/]+/locations/(?P<region>[^/]+)/tensorboards/[^/]+$")


class LaunchError(Exception):
    """A sweep that cannot start as configured; the message says what to change."""


def check_settings(settings: VertexLauncherConf) -> None:
    """Everything the launcher can check from its own settings, with the fix in each message."""
    _require(settings.project, "hydra.launcher.project",
             "hydra.launcher.project=MY_PROJECT (or export GOOGLE_CLOUD_PROJECT)")
    _require(settings.staging_bucket, "hydra.launcher.staging_bucket", "hydra.launcher.staging_bucket=gs://MY_BUCKET")
    if not str(settings.staging_bucket).startswith("gs://"):
        raise LaunchError(f"hydra.launcher.staging_bucket={settings.staging_bucket} is not a gs:// path")
    if not settings.python_package():
        _require(settings.image_uri, "hydra.launcher.image_uri",
                 "hydra.launcher.image_uri=REGION-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG "
                 "(see the README), or hydra.launcher.packaging=python_package")
    if settings.max_concurrent_jobs < 1 or settings.poll_interval <= 0 or settings.failed_log_lines < 0:
        raise LaunchError("hydra.launcher.max_concurrent_jobs must be >= 1, poll_interval > 0 and "
                          "failed_log_lines >= 0")
    for name, version in settings.secrets.items():
        if not _SECRET_VERSION.match(version):
            raise LaunchError(f"hydra.launcher.secrets.{name}={version} is not a Secret Manager version: "
                              "write projects/PROJECT/secrets/NAME/versions/latest")
    _check_env(settings)
    if settings.tensorboard:
        _check_tensorboard(settings)


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
                f"projects/PROJECT/secrets/SECRET/versions/latest}}' (see the README)")


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
