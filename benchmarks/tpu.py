"""Training speed on a Cloud TPU (or on any PyTorch/XLA device): examples/s and real tokens/s once
every graph is compiled, the tokens per example they come from, the graphs XLA compiled and how long
that took, and model FLOPs utilisation against the TPU's bf16 peak. Data: sentence pairs with MNLI's
lengths and a model with random weights (benchmarks.mnli_like), so nothing is downloaded.

On a TPU host, in the TPU image (docker build --target tpu) or an environment with requirements/tpu.txt,
from the repository root:

    python -m benchmarks.tpu --hw tpu-v3-8 --arch roberta-large --steps 300
    python -m benchmarks.tpu --hw tpu-v5e-8 --arch roberta-large --steps 300 -- train.batch_size=256

On a machine without one, PJRT_DEVICE=CPU runs the same command on XLA's CPU device (the tests do,
with a tiny model): the figures then measure that CPU, and MFU is left out (no TPU peak applies).

The seed's "2,400 examples/s for roberta-large on a TPU v2-8" is above what that TPU can compute at
128 tokens per example (see --ceiling): a figure in examples/s means little without its tokens per
example, printed beside it here.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional

from omegaconf import OmegaConf

from benchmarks.mnli_like import write_glue_folder, write_random_model
from benchmarks.vs_trainer import flops_per_token

ROOT = Path(__file__).resolve().parent.parent
# Dense bf16 peak per XLA device (FLOP/s), from Google's Cloud TPU system architecture pages: v2 and
# v3 chips have two TensorCores, each its own device (45 and 123 TFLOPS per chip); a v5e chip is one.
PEAK_BF16_PER_DEVICE = {"v2": 22.5e12, "v3": 61.5e12, "v5e": 197e12}


def main() -> None:
    args = parse()
    if args.ceiling:
        print(ceiling(args.arch, tokens=args.ceiling_tokens, hw=args.hw))
        return
    with tempfile.TemporaryDirectory(prefix="tpu-bench-") as tmp:
        work = Path(tmp)
        texts = write_glue_folder(work / "glue" / "RTE", train=args.examples, dev=256, seed=0)
        write_random_model(work / "model", architecture=args.arch, texts=texts, max_seq_length=args.seq_len)
        figures = run(args, work)
        figures["flops_per_token"] = flops_per_token(work / "model", mean_tokens=figures["tokens_per_example"])
    peak = peak_flops(args.hw)
    if peak and os.environ.get("PJRT_DEVICE", "TPU") == "TPU":
        figures["mfu"] = figures["flops_per_token"] * figures["tokens_per_second"] / peak
    report = {"hw": args.hw, "arch": args.arch, "steps": args.steps, "seq_len": args.seq_len,
              "pjrt_device": os.environ.get("PJRT_DEVICE", "TPU"), "overrides": args.overrides, **figures}
    print(table(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hw", default="tpu-v5e-8", help="a conf/hw preset with accelerator: xla")
    parser.add_argument("--arch", default="roberta-large", choices=["roberta-large", "roberta-base", "tiny"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--examples", type=int, default=20000, help="synthetic training pairs")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--out", help="write the figures here as JSON too")
    parser.add_argument("--ceiling", action="store_true",
                        help="print the most examples/s the preset's bf16 peak allows, and exit")
    parser.add_argument("--ceiling-tokens", type=int, default=128, help="tokens per example for --ceiling")
    parser.add_argument("overrides", nargs="*", help="after --: more train.py overrides")
    return parser.parse_args()


def preset(hw: str) -> Dict:
    return dict(OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "hw" / f"{hw}.yaml")))  # type: ignore[arg-type]


def peak_flops(hw: str) -> Optional[float]:
    found = preset(hw)
    per_device = PEAK_BF16_PER_DEVICE.get(str(found.get("tpu")))
    return per_device * int(found.get("tpu_devices") or 1) if per_device else None


def run(args: argparse.Namespace, work: Path) -> Dict[str, float]:
    """One run of train.py (one process per device through nli.xla_launch where the preset has several)."""
    out = work / "run"
    devices = int(preset(args.hw).get("tpu_devices") or 1)
    entry = ["-m", "nli.xla_launch"] if devices > 1 else [str(ROOT / "train.py")]
    command = [sys.executable, *entry, "task=rte", f"hw={args.hw}", f"model.name_or_path={work / 'model'}",
               f"data.dir={work / 'glue'}", f"data.max_seq_length={args.seq_len}", f"train.max_steps={args.steps}",
               f"train.eval_every={args.steps}", f"train.checkpoint_every={args.steps}",
               f"train.log_every={max(args.steps // 10, 1)}", "train.progress_bar=false", "train.resume=false",
               "logger=csv", f"output_dir={out}", f"hydra.run.dir={out}", *args.overrides]
    proc = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"train.py failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    results = json.loads((out / "results.json").read_text())
    steady = last_window(out / "metrics.csv")
    return {"examples_per_second": steady["train/examples_per_second"],
            "tokens_per_second": steady["train/tokens_per_second"],
            "tokens_per_example": results["train_tokens_per_second"] / results["train_examples_per_second"],
            "examples_per_second_with_compilation": results["train_examples_per_second"],
            "xla_compilations": results["xla_compilations"], "xla_compile_seconds": results["xla_compile_seconds"]}


def last_window(metrics: Path) -> Dict[str, float]:
    """The training figures of the last logged window: every graph compiled by then."""
    rows = list(csv.DictReader(metrics.open()))
    last = max(int(row["step"]) for row in rows if row["metric"] == "train/examples_per_second")
    return {row["metric"]: float(row["value"]) for row in rows if int(row["step"]) == last}


def ceiling(arch: str, *, tokens: int, hw: str) -> str:
    """The most examples/s ``hw``'s bf16 peak allows for ``arch`` at ``tokens`` per example."""
    peak = peak_flops(hw)
    if peak is None:
        sys.exit(f"--hw {hw} is not a TPU preset with a known peak ({', '.join(PEAK_BF16_PER_DEVICE)})")
    with tempfile.TemporaryDirectory() as tmp:
        write_random_model(Path(tmp), architecture=arch, texts=["a b c"] * 8, max_seq_length=tokens)
        per_example = flops_per_token(Path(tmp), mean_tokens=tokens) * tokens
    return (f"{arch} at {tokens} tokens per example: {per_example / 1e9:.0f} GFLOPs to train on one; {hw}'s bf16 "
            f"peak of {peak / 1e12:.0f} TFLOPS allows at most {peak / per_example:.0f} examples/s")


ROWS = [("examples_per_second", "examples/s (compiled)", "{:.1f}"), ("tokens_per_example", "tokens per example",
        "{:.1f}"), ("tokens_per_second", "real tokens/s", "{:.0f}"),
        ("examples_per_second_with_compilation", "examples/s (whole run)", "{:.1f}"),
        ("xla_compilations", "graphs compiled", "{:.0f}"), ("xla_compile_seconds", "compiling (s)", "{:.1f}"),
        ("mfu", "MFU (real tokens)", "{:.1%}")]


def table(report: Dict) -> str:
    lines = [f"{report['arch']} on {report['hw']} (PJRT_DEVICE={report['pjrt_device']}), {report['steps']} steps, "
             f"{report['seq_len']} tokens at most", "| figure | value |", "|---|---:|"]
    lines += [f"| {title} | {fmt.format(report[key])} |" for key, title, fmt in ROWS if report.get(key) is not None]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
