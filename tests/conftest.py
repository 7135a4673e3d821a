"""The suite's environment and shared fixtures. How tests run the project: tests/support/runs.py.

The environment is the suite's own, whatever the shell that starts it: the variables that change what
a run does (the Hugging Face and W&B ones, a platform's, the CPU kernels') are cleared before any
library reads them, and each test sets what it depends on. Set here, before torch, datasets and
transformers load (they read them at import); processes the tests start inherit them.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

# Prefixes and names of the variables a user's shell may hold that change what a run or a library does.
_FOREIGN_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "WANDB_", "AIP_", "CLOUD_ML_", "SLURM_", "SUBMITIT_",
                     "TORCHELASTIC_", "PJRT_", "TPU_", "XLA_", "MKL_", "ONEDNN_", "DNNL_", "KMP_", "GOOGLE_",
                     "CLOUDSDK_", "HYDRA_")
_FOREIGN = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "CLUSTER_SPEC", "STORAGE_EMULATOR_HOST", "ATEN_CPU_CAPABILITY", "CUDA_VISIBLE_DEVICES", "NETRC",
            "MALLOC_MMAP_THRESHOLD_"}
for _name in [name for name in os.environ if name.startswith(_FOREIGN_PREFIXES) or name in _FOREIGN]:
    del os.environ[_name]
# One thread per process: the suite runs two workers on two cores, each running runs of its own; with a
# thread per core, OpenMP's spinning threads fight over the cores (two quickstarts side by side: 8
# minutes instead of 1).
os.environ["OMP_NUM_THREADS"] = "1"
# precision=auto computes in bf16 on a CPU with native bf16 and in fp32 elsewhere (nli.runtime.device): the suite
# holds oneDNN to AVX2's instructions, below bf16's, so that auto is fp32 on every CPU and no test's
# figures depend on the machine it runs on. Tests of the bf16 choice give it the CPU's flags themselves.
os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
# One Hugging Face cache (datasets' tokenized splits, downloads) for the whole session, its workers and
# the processes they start: made by the first process (pytest's, or xdist's controller) and inherited.
# Tests of the cache itself use a fresh one (the datasets_cache fixture).
if "NLI_TEST_HF_HOME" not in os.environ:
    os.environ["NLI_TEST_HF_HOME"] = tempfile.mkdtemp(prefix="nli-tests-hf-")
    _OWNS_CACHE = True
else:
    _OWNS_CACHE = False
os.environ["HF_HOME"] = os.environ["NLI_TEST_HF_HOME"]
# gcloud's configuration (its project and region are the Vertex launcher's defaults): none, whatever the
# machine's user told gcloud. Tests of reading it make one of their own.
os.environ["CLOUDSDK_CONFIG"] = os.path.join(os.environ["NLI_TEST_HF_HOME"], "no-gcloud-config")

import socket  # noqa: E402  (the environment above first)
from pathlib import Path  # noqa: E402
from typing import Callable, Dict, Iterator, List, Sequence  # noqa: E402

import datasets  # noqa: E402
import pytest  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from nli.config.schema import Config, register_configs  # noqa: E402
from tests.support.runs import CONF, finished_run  # noqa: E402
from tests.support.tiers import mark_quick  # noqa: E402

register_configs()


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """Tests that start processes first: they are the long ones (10 to 45 s each), so that on two workers
    the many short ones fill in around them instead of one long test running on alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("process") is None)
    mark_quick(items)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWNS_CACHE and not hasattr(config, "workerinput"):  # the process that made the cache removes it
        shutil.rmtree(os.environ["NLI_TEST_HF_HOME"], ignore_errors=True)


@pytest.fixture(autouse=True)
def no_wandb_left_behind() -> Iterator[None]:
    """A test that ran W&B in this process (a sweep through Hydra's own runner, say) leaves no W&B service
    and no WANDB_SERVICE address behind, which processes started later would inherit and fail to reach."""
    yield
    if "WANDB_SERVICE" in os.environ:
        import wandb

        wandb.teardown()
        os.environ.pop("WANDB_SERVICE", None)


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


@pytest.fixture(scope="session")
def shared_root(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A folder inside pytest's temporary directory that every xdist worker of this session sees
    (tests/support/runs.py: shared_folder)."""
    base = tmp_path_factory.getbasetemp()
    return (base if worker_id == "master" else base.parent) / "session-runs"


@pytest.fixture(scope="session")
def shared_run(shared_root: Path) -> Callable[[str, Sequence[str]], Path]:
    """``shared_run(name, args)``: the folder of a finished run of ``args``, trained once per session and
    shared by every worker (tests/support/runs.py). Read it; copy it to change it (tests.support.runs.copy_run)."""

    def get(name: str, args: Sequence[str]) -> Path:
        return finished_run(shared_root, name, args)

    return get


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
    # The server answers from threads of this process: its lines (each request, each object not found) would
    # land in whatever train.log or stderr an in-process run has open. The clients see its answers.
    emulator_log = logging.getLogger("gcp_storage_emulator")
    emulator_log.propagate = False
    emulator_log.addHandler(logging.NullHandler())
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
