"""Makes this folder's run and sweep folders with the code of a checkout:
``python tests/data/legacy/make.py CHECKOUT OUT [PART ...]`` (README.md says which commit made the ones here),
PART one of run-finished, run-stopped, sweep, vertex-sweep (all of them when none is named)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

# A 1-layer, 16-wide RoBERTa from scratch on the synthetic task: folders of a few hundred kilobytes.
ARGS = ["experiment=quickstart", "data.synthetic_train_size=320", "data.synthetic_eval_size=64", "hw=cpu",
        "model.scratch.vocab_size=320", "model.scratch.hidden_size=16", "model.scratch.num_hidden_layers=1",
        "model.scratch.num_attention_heads=2", "model.scratch.intermediate_size=32",
        "train.max_steps=20", "train.eval_every=10", "train.log_every=1", "train.checkpoint_every=5",
        "train.keep_checkpoints=1", "train.progress_bar=false"]
SWEEP = [*(arg for arg in ARGS if not arg.startswith("train.max_steps=")), "train.max_steps=6", "seed=1,2"]
# A Vertex AI sweep that did not wait, as tests/clouds/test_cloud.py launches one, against the checkout's own
# fake Vertex AI and a Cloud Storage emulator; its jobs are held pending and never run here.
PROJECT, BUCKET = "test-project", "gs://test-bucket/sweeps"
IMAGE = "us-central1-docker.pkg.dev/test-project/nli/train:test"
VERTEX = ["hydra/launcher=vertex", f"hydra.launcher.project={PROJECT}", "hydra.launcher.region=us-central1",
          f"hydra.launcher.staging_bucket={BUCKET}", f"hydra.launcher.image_uri={IMAGE}",
          "hydra.launcher.poll_interval=0.1", "hydra.launcher.sweep_name=legacy", "hydra.launcher.wait=false"]
PARTS = ("run-finished", "run-stopped", "sweep", "vertex-sweep")


def main(code: Path, out: Path, parts: Sequence[str]) -> None:
    # One thread and AVX2 kernels, as the suite computes (tests/conftest.py): what today's code trains on
    # from these checkpoints is then bit for bit what the old code trained.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(code / "launch")]), "WANDB_MODE": "disabled",
           "OMP_NUM_THREADS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"}

    def run(args: List[str]) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, *args], cwd=code, env=env, text=True, capture_output=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    out.mkdir(parents=True, exist_ok=True)
    for part in parts:
        shutil.rmtree(out / part, ignore_errors=True)
    if "run-finished" in parts:
        run(["train.py", *ARGS, f"hydra.run.dir={out}/run-finished"])
    if "run-stopped" in parts:
        stop_after_step(code, env, out / "run-stopped", step=7)
    if "sweep" in parts:
        run(["train.py", "-m", *SWEEP, f"hydra.sweep.dir={out}/sweep"])
        run(["-m", "nli.report", f"{out}/sweep"])
        (out / "sweep" / "learning_curves.png").unlink()  # the report draws it again; 100 kB of no use here
    if "vertex-sweep" in parts:
        run([str(Path(__file__).resolve()), "--vertex-sweep", str(out / "vertex-sweep")])


def vertex_sweep(out: Path) -> None:
    """Run in the checkout (its tests/ and launch/ first on the path): `train.py -m` on hydra/launcher=vertex,
    not waiting, then what a later `attach` reads: the sweep's folder, the CustomJobs the launcher created
    (requests.json) and what it wrote to the bucket (bucket/)."""
    import tempfile

    from gcp_storage_emulator.server import create_server

    from tests.fake_vertex import FakeVertex  # the checkout's

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="test-bucket")
    server.start()
    env = {**os.environ, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}",
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as scratch, \
            FakeVertex(log_dir=Path(scratch) / "logs", pending_seconds=3600.0) as fake:
        fake.add_image(IMAGE, entrypoint=[sys.executable, "train.py"], workdir=Path(scratch))
        # Launched from the folder that holds the sweep's, as a user does: its jobs' run directories are then
        # relative (sweep/0), which the suite's fake makes in a folder of the test's.
        out.mkdir(parents=True)
        proc = subprocess.run([sys.executable, str(Path("train.py").resolve()), "-m", *SWEEP, *VERTEX,
                               f"hydra.launcher.api_endpoint={fake.endpoint}", "hydra.sweep.dir=sweep"],
                              cwd=out, env=env, text=True, capture_output=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        created = [{"path": path, "body": body} for method, path, body in fake.requests
                   if method == "POST" and path.split("?")[0].endswith("/customJobs")]
        (out / "requests.json").write_text(json.dumps(created, indent=1) + "\n")
        _copy_bucket(env, out / "bucket")
    server.stop()


def _copy_bucket(env: Dict[str, str], folder: Path) -> None:
    import fsspec

    os.environ.update(env)
    fs = fsspec.filesystem("gs", token="anon", endpoint_url=env["STORAGE_EMULATOR_HOST"])
    for path in fs.find("test-bucket"):
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(fs.cat_file(path))


def stop_after_step(code: Path, env: dict, run_dir: Path, *, step: int) -> None:
    """A run stopped by SIGTERM once its log shows ``step``: resumable, with a checkpoint of the step it stopped at."""
    proc = subprocess.Popen([sys.executable, "train.py", *ARGS, f"hydra.run.dir={run_dir}"], cwd=code, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log = run_dir / "train.log"
    while f"step {step}: loss" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate()
    assert proc.returncode == 75 and re.search(r"SIGTERM at step \d+", err), out + err


if __name__ == "__main__":
    if sys.argv[1] == "--vertex-sweep":
        vertex_sweep(Path(sys.argv[2]))
    else:
        main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), sys.argv[3:] or PARTS)
