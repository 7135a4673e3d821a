"""An Optuna search four ways: trials in batches (as Hydra's own sweepers run them) or each started as soon
as a slot frees, without pruning or with the median pruner; the wall time of each whole search, its
trials (complete, pruned, failed), the time its trials took (start to end, summed: the slots' time) and its
best objective.

    python -m benchmarks.search                                  # 12 trials of the quickstart, 2 at a time
    python -m benchmarks.search --trials 6 --size 640 --launcher basic

Each search is ``python train.py -m experiment=quickstart hparams_search=quickstart`` under the
``submitit_local`` launcher (a process per trial, as on Slurm), over a learning rate from 1e-4 to 1 on a
log scale, where the largest diverge or stall at chance, and batch sizes 16 to 64 make trials of several
lengths. Optuna's random sampler with the same seed draws the same trials in every search, whatever order
their results come back in, so the four differ in how the trials run alone: the best objective is the same
unless the pruner stopped the trial that would have been best. The median pruner judges a trial from its
third evaluation on (``n_warmup_steps``), after 4 trials ended unpruned. The searches alternate over
``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
SEARCHES = {  # name -> the sweeper's settings
    "batched": ["hydra.sweeper.asynchronous=false"],
    "asynchronous": ["hydra.sweeper.asynchronous=true"],
    "batched, median pruner": ["hydra.sweeper.asynchronous=false", "hydra/sweeper/pruner=median"],
    "asynchronous, median pruner": ["hydra.sweeper.asynchronous=true", "hydra/sweeper/pruner=median"],
}
PRUNED = "pruner"  # the searches whose names say so judge trials from their third evaluation
LAUNCHERS = {"submitit_local": ["hydra/launcher=submitit_local"], "basic": []}


def search(work: Path, name: str, args: argparse.Namespace) -> Dict[str, float]:
    """One search, in a sweep directory of its own: its wall time, trials by state and best objective."""
    sweep_dir = Path(tempfile.mkdtemp(dir=work)) / "search"
    command = [sys.executable, str(ROOT / "train.py"), "-m", "experiment=quickstart", "hparams_search=quickstart",
               f"data.synthetic_train_size={args.size}", "train.progress_bar=false",
               f"train.eval_every={args.eval_every}",
               "optimizer.lr=tag(log,interval(1e-4,1.0))", f"hydra.sweeper.n_trials={args.trials}",
               f"hydra.sweeper.n_jobs={args.jobs}", "hydra/sweeper/sampler=random",
               "~hydra.sweeper.sampler.n_startup_trials",  # the search's option for TPE
               f"hydra.sweeper.sampler.seed={args.seed}", "hydra.sweeper.poll_interval=1",
               f"hydra.sweep.dir={sweep_dir}", *LAUNCHERS[args.launcher], *SEARCHES[name],
               *([f"hydra.sweeper.pruner.n_warmup_steps={2 * args.eval_every}",
                  "hydra.sweeper.pruner.n_startup_trials=4"] if PRUNED in name else [])]
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=work, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    if not (sweep_dir / "optuna.db").exists():
        raise SystemExit(f"search '{name}' in {sweep_dir} did not start (status {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    with sqlite3.connect(sweep_dir / "optuna.db") as db:
        states = [state for (state,) in db.execute("SELECT state FROM trials")]
        values = [value for (value,) in db.execute(
            "SELECT v.value FROM trial_values v JOIN trials t USING (trial_id) WHERE t.state = 'COMPLETE'")]
        # The slots' time the trials took, start to end: what pruning saves (Optuna's own timestamps).
        busy = sum(seconds for (seconds,) in db.execute(
            "SELECT (julianday(datetime_complete) - julianday(datetime_start)) * 86400 FROM trials "
            "WHERE datetime_complete IS NOT NULL"))
    return {"seconds": seconds, "trial_seconds": busy, "complete": states.count("COMPLETE"),
            "pruned": states.count("PRUNED"), "failed": states.count("FAIL"),
            "best": max(values) if values else float("nan"), "objectives": sorted(values)}


def table(runs: Dict[str, List[Dict[str, float]]]) -> str:
    base = mean(run["seconds"] for run in runs["batched"])
    lines = ["| search | wall time (s) | vs batched | trials' time (s) | trials complete / pruned / failed | "
             "best objective |", "|---|---:|---:|---:|---|---|"]
    for name, each in runs.items():
        seconds, busy = (mean(run[key] for run in each) for key in ("seconds", "trial_seconds"))
        counts = ", ".join(f"{run['complete']:.0f} / {run['pruned']:.0f} / {run['failed']:.0f}" for run in each)
        best = ", ".join(f"{run['best']:.4f}" for run in each)
        lines.append(f"| {name} | {seconds:.1f} | {base / seconds:.2f}x | {busy:.0f} | {counts} | {best} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--jobs", type=int, default=2, help="trials at once (hydra.sweeper.n_jobs)")
    parser.add_argument("--size", type=int, default=2000, help="the quickstart's training examples")
    parser.add_argument("--eval-every", type=int, default=20, help="steps between evaluations: the pruner's reports")
    parser.add_argument("--launcher", choices=sorted(LAUNCHERS), default="submitit_local")
    parser.add_argument("--seed", type=int, default=1, help="the sampler's seed, the same in every search")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write each search's figures here")
    args = parser.parse_args(argv)
    for flag in ("trials", "jobs", "size", "eval_every", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in SEARCHES}
    with tempfile.TemporaryDirectory() as work:
        for round_ in range(args.rounds):
            for name in SEARCHES if round_ % 2 == 0 else reversed(SEARCHES):
                runs[name].append(search(Path(work), name, args))
                print(f"{name}: {json.dumps(runs[name][-1])}", flush=True)
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n")
        print(f"written to {args.json}")


if __name__ == "__main__":
    main()
