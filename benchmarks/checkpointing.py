"""Gradient checkpointing's trade: training examples/s and peak memory with train.gradient_checkpointing
off and on, the same run otherwise, alternating over rounds (each figure the mean).

    python -m benchmarks.checkpointing                    # MiniLM-L6 (the test extras) on MNLI-like pairs, CPU
    python -m benchmarks.checkpointing --model quickstart
    python -m benchmarks.checkpointing --model roberta-large --steps 50   # on a GPU: its shape, random weights

Peak memory is what results.json reports: the CUDA allocator's peak on a GPU, the process's peak
resident memory on a CPU (where the model's weights and the heap dominate, so activations show less).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import mean
from typing import Dict, List

from benchmarks.company import model_overrides

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ("off", "on")


def overrides(model: str, steps: int) -> List[str]:
    if model == "roberta-large":  # RoBERTa-large's shape from scratch: nothing to download
        return ["experiment=quickstart", "model.scratch.hidden_size=1024", "model.scratch.num_hidden_layers=24",
                "model.scratch.num_attention_heads=16", "model.scratch.intermediate_size=4096",
                "data.max_seq_length=128", f"train.max_steps={steps}"]
    return model_overrides(model, steps)


def run(work: Path, args: List[str], setting: str) -> Dict[str, float]:
    out = Path(tempfile.mkdtemp(dir=work)) / "run"
    command = [sys.executable, str(ROOT / "train.py"), *args, f"train.gradient_checkpointing={setting == 'on'}",
               "train.progress_bar=false", f"hydra.run.dir={out}", "train.resume=false"]
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    proc = subprocess.run(command, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run in {out} failed:\n{proc.stderr[-3000:]}")
    results = json.loads((out / "results.json").read_text())
    return {"examples_per_second": results["train_examples_per_second"],
            "peak_gib": results["peak_memory_bytes"] / 2**30}


def table(runs: Dict[str, List[Dict[str, float]]]) -> str:
    base = {key: mean(r[key] for r in runs["off"]) for key in ("examples_per_second", "peak_gib")}
    lines = ["| gradient checkpointing | examples/s | peak memory (GiB) |", "|---|---:|---:|"]
    for setting in SETTINGS:
        speed, peak = (mean(r[key] for r in runs[setting]) for key in ("examples_per_second", "peak_gib"))
        lines.append(f"| {setting} | {speed:.1f} ({speed / base['examples_per_second']:.2f}x) | "
                     f"{peak:.2f} ({peak / base['peak_gib']:.2f}x) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["minilm", "quickstart", "roberta-large"], default="minilm")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the runs' figures here")
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    runs: Dict[str, List[Dict[str, float]]] = {setting: [] for setting in SETTINGS}
    with tempfile.TemporaryDirectory() as work:
        for round_ in range(args.rounds):
            for setting in SETTINGS if round_ % 2 == 0 else reversed(SETTINGS):
                runs[setting].append(run(Path(work), overrides(args.model, args.steps), setting))
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
