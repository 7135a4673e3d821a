"""Reference outcomes: two runs whose results and exported weights must not change unless a change
means them to (tests/runs/test_reference.py compares against them).

Recorded on the code before the run became a library call (its results, before that, equal those
recorded before the recipe's restructure into named phases), so that each restructure is shown to
change nothing a run computes. The runs pin every CPU kernel that a library picks by the instruction
set, so that the same bits come out of any x86-64 machine, on one thread:

- MKL (matrix products): its compatible branch, the one it keeps reproducible on Intel and AMD alike;
- torch's own kernels: those without vector extensions (``ATEN_CPU_CAPABILITY=default``);
- oneDNN, which torch also calls on the CPU: its SSE4.1 kernels, the oldest it has (x86-64 CPUs since
  2008). Without this pin, the quickstart's 41 exported tensors all differ between an AVX2 CPU and an
  AVX-512 one (an AMD EPYC with AVX512-BF16) with MKL and torch pinned; with ``ONEDNN_MAX_CPU_ISA=AVX2``
  on the AVX-512 CPU they equal the AVX2 CPU's bit for bit, so oneDNN was the only one left to pin.

To record them again, after a change that is meant to alter what a run computes (say so in the
commit): ``python -m tests.support.reference``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).resolve().parents[1] / "data" / "reference"
# What a run measures rather than computes, and where it ran (nli.runtime.provenance): it differs between equal runs.
MEASURED = {"train_examples_per_second", "train_tokens_per_second", "train_seconds", "peak_memory_bytes",
            "eval_examples_per_second", "provenance"}
PORTABLE = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
            "OMP_NUM_THREADS": "1"}

# The README's quick start as the suite runs it, and a two-process torchrun run (dropout off: each
# rank draws its own masks) with a short last batch split over the ranks.
RUNS: Dict[str, List[str]] = {
    "quickstart": ["experiment=quickstart", "train.progress_bar=false"],
    "torchrun": ["experiment=quickstart", "data.synthetic_train_size=330", "data.synthetic_eval_size=96",
                 "train.max_steps=12", "train.eval_every=6", "train.log_every=3", "train.progress_bar=false",
                 "hw=cpu", "model.scratch.dropout=0"],
}


def command(name: str, run_dir: Path) -> List[str]:
    entry = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
             if name == "torchrun" else [sys.executable])
    return [*entry, str(ROOT / "train.py"), *RUNS[name], f"hydra.run.dir={run_dir}"]


def run(name: str, run_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **PORTABLE}
    return subprocess.run(command(name, run_dir), cwd=run_dir.parent, env=env, capture_output=True, text=True,
                          timeout=900)


def digest(run_dir: Path) -> Dict[str, Any]:
    """What the run computed: results.json without the measured figures, and a SHA-256 of every
    exported weight tensor (its raw bytes, dtype and shape)."""
    results = json.loads((run_dir / "results.json").read_text())
    tensors = load_file(run_dir / "model" / "model.safetensors")
    weights = {key: hashlib.sha256(f"{array.dtype}{array.shape}".encode() + array.tobytes()).hexdigest()
               for key, array in sorted(tensors.items())}
    return {"results": {k: v for k, v in results.items() if k not in MEASURED}, "weights": weights}


def recorded(name: str) -> Dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())


def record() -> None:
    RECORDED.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in RUNS:
            run_dir = Path(tmp) / name
            proc = run(name, run_dir)
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed:\n{proc.stdout}{proc.stderr}")
            (RECORDED / f"{name}.json").write_text(json.dumps(digest(run_dir), indent=1, sort_keys=True) + "\n")
            print(f"recorded {RECORDED / name}.json")


if __name__ == "__main__":
    record()
