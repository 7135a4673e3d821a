"""Shared helpers: compose the real config, and run the real train.py in a subprocess."""

from __future__ import annotations

import os

# One thread per process: the suite runs two workers on two cores, each starting runs of its own, and
# with torch's default of a thread per core OpenMP's spinning threads fight over the cores (two
# quickstarts side by side: 8 minutes instead of 1). Set before torch loads; runs inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import datasets
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from nli.config import Config, register_configs

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
GLUE_DATA = ROOT / "tests" / "data" / "glue_data"  # real RTE and WNLI, in GLUE's layout (tests/data/README.md)

# A few hundred synthetic examples and a handful of steps: seconds per run on 2 CPU cores.
# What a run measures rather than computes: the only results that differ between equal runs.
MEASURED = {"train_examples_per_second", "train_tokens_per_second", "train_seconds", "peak_memory_bytes"}
FAST = ["experiment=quickstart", "data.synthetic_train_size=320", "data.synthetic_eval_size=96",
        "train.max_steps=12", "train.eval_every=6", "train.log_every=3", "train.progress_bar=false"]

register_configs()


@pytest.fixture(scope="session", autouse=True)
def hydra_conf() -> Iterator[None]:
    """Hydra initialised on conf/ once for the whole session; composing is then cheap."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        yield


def compose_config(overrides: List[str]) -> DictConfig:
    """The config train.py would get, composed by Hydra from conf/."""
    return compose("train", overrides=overrides)


def build_config(overrides: List[str]) -> Config:
    """The typed config the run builds, with every rule checked."""
    return OmegaConf.to_object(compose_config(overrides))


@pytest.fixture
def datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``datasets`` cache for this test, so that no run reuses another's files."""
    cache = tmp_path / "datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[Dict[str, str]]:
    """A Cloud Storage server on localhost (gcp-storage-emulator) with the bucket ``test-bucket``;
    yields the environment under which google-cloud-storage and gcsfs talk to it."""
    from gcp_storage_emulator.server import create_server

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="test-bucket")
    server.start()
    # Without the last variable, recent gcsfs waits about a minute per bucket on an emulator.
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


def run_train(args: List[str], *, cwd: Path, module: bool = False, timeout: float = 600,
              env: Dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python train.py ARGS`` (or ``python -m nli ARGS``) as a user types it."""
    entry = ["-m", "nli"] if module else [str(ROOT / "train.py")]
    full_env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.run([sys.executable, *entry, *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def read_results(output_dir: Path) -> Dict[str, Any]:
    return json.loads((output_dir / "results.json").read_text())
