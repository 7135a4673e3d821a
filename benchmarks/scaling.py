"""Data-parallel scaling: the same run on 1, 2, ... processes under torchrun (one per GPU, or one
per CPU core), with the same global batch; prints examples/s, the speed-up over one process and
the scaling efficiency (speed-up / processes), and writes them as JSON.

    python -m benchmarks.scaling                                  # CPU: model=tiny, 1 and 2 processes
    python -m benchmarks.scaling --processes 1 2 --steps 200 -- \\
        model=roberta-large task=synthetic hw=a100 precision=bf16 train.batch_size=64

Overrides after ``--`` go to every run. Throughput is train.py's own ``train_examples_per_second``:
optimizer steps only, evaluation and checkpoints excluded. The runs alternate (1, 2, 1, 2, ...)
over ``--repeats`` rounds so that a machine that slows down over time does not favour one size; the
best round of each size is reported. On the CPU every process gets one thread (OMP_NUM_THREADS=1),
so that N processes use N cores against one process's one core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
CPU_DEFAULTS = ["experiment=quickstart", "hw=cpu", "data.synthetic_train_size=2048", "model.scratch.dropout=0"]


def run(processes: int, steps: int, overrides: List[str], workdir: Path) -> Dict[str, float]:
    """One train.py run under torchrun; its results.json."""
    out = workdir / f"p{processes}"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               str(ROOT / "train.py"), *overrides, f"train.max_steps={steps}", f"train.eval_every={steps}",
               f"train.checkpoint_every={steps}", "train.progress_bar=false", f"output_dir={out}",
               f"hydra.run.dir={out}", "train.resume=false"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{processes} process(es) failed:\n{proc.stderr[-4000:]}")
    results = json.loads((out / "results.json").read_text())
    shutil.rmtree(out)  # the next round starts afresh
    return results


def table(best: Dict[int, Dict[str, float]]) -> List[Dict[str, float]]:
    """Speed-up over the smallest size, and efficiency: the speed-up per process added."""
    smallest = min(best)
    base = best[smallest]["train_examples_per_second"]
    rows = []
    for n, results in sorted(best.items()):
        speedup = results["train_examples_per_second"] / base
        rows.append({"processes": n, "examples_per_second": round(results["train_examples_per_second"], 1),
                     "speedup": round(speedup, 3), "efficiency": round(speedup * smallest / n, 3),
                     "objective": results["objective"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of every size, alternating")
    parser.add_argument("--json", type=Path, default=Path("scaling.json"), help="where the table goes")
    parser.add_argument("overrides", nargs="*", help="train.py overrides (after --); default: a CPU quickstart")
    args = parser.parse_args()
    overrides = args.overrides or CPU_DEFAULTS
    best: Dict[int, Dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.repeats):
            for n in args.processes:
                results = run(n, args.steps, overrides, Path(tmp))
                print(f"round {round_ + 1}, {n} process(es): {results['train_examples_per_second']:.1f} examples/s",
                      flush=True)
                if n not in best or results["train_examples_per_second"] > best[n]["train_examples_per_second"]:
                    best[n] = results
    rows = table(best)
    print(f"\n{'processes':>9} {'examples/s':>11} {'speed-up':>9} {'efficiency':>10}")
    for row in rows:
        print(f"{row['processes']:>9} {row['examples_per_second']:>11.1f} {row['speedup']:>9.2f} "
              f"{row['efficiency']:>10.0%}")
    args.json.write_text(json.dumps({"overrides": overrides, "steps": args.steps, "rows": rows}, indent=2) + "\n")
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
