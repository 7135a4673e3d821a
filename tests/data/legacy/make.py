"""Makes this folder's run and sweep folders with the code of a checkout:
``python tests/data/legacy/make.py CHECKOUT OUT`` (README.md says which commit made the ones here)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

# A 1-layer, 16-wide RoBERTa from scratch on the synthetic task: folders of a few hundred kilobytes.
ARGS = ["experiment=quickstart", "data.synthetic_train_size=320", "data.synthetic_eval_size=64", "hw=cpu",
        "model.scratch.vocab_size=320", "model.scratch.hidden_size=16", "model.scratch.num_hidden_layers=1",
        "model.scratch.num_attention_heads=2", "model.scratch.intermediate_size=32",
        "train.max_steps=20", "train.eval_every=10", "train.log_every=1", "train.checkpoint_every=5",
        "train.keep_checkpoints=1", "train.progress_bar=false"]
SWEEP = [*(arg for arg in ARGS if not arg.startswith("train.max_steps=")), "train.max_steps=6", "seed=1,2"]


def main(code: Path, out: Path) -> None:
    # One thread and AVX2 kernels, as the suite computes (tests/conftest.py): what today's code trains on
    # from these checkpoints is then bit for bit what the old code trained.
    env = {**os.environ, "PYTHONPATH": str(code), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "ONEDNN_MAX_CPU_ISA": "AVX2"}

    def run(args: List[str]) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, *args], cwd=code, env=env, text=True, capture_output=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run(["train.py", *ARGS, f"hydra.run.dir={out}/run-finished"])
    stop_after_step(code, env, out / "run-stopped", step=7)
    run(["train.py", "-m", *SWEEP, f"hydra.sweep.dir={out}/sweep"])
    run(["-m", "nli.report", f"{out}/sweep"])
    (out / "sweep" / "learning_curves.png").unlink()  # the report draws it again; 100 kB of no use here


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
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
