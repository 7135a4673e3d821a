"""The GPU check's speed and memory lines: roberta-large against the tuned Trainer, MFU, DataLoader workers, and each
GPU preset x recipe measured against its card."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, Sequence

from benchmarks.gpu_check import Figures
from benchmarks.gpu_check.report import atomic_write
from benchmarks.gpu_check.subruns import Check, Line, OutOfTime, Skipped, require, sub_run


def vs_trainer(check: Check, line: Line, label: str, flags: Sequence[str], *, timeout: float) -> Dict[str, Figures]:
    """``benchmarks.vs_trainer --synthetic --arch roberta-large --precision bf16 FLAGS``: each system's figures;
    its JSON and Markdown kept in the report's benchmarks.json and benchmarks.md, under ``LABEL``."""
    out = check.work / "benchmarks" / label
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "benchmarks.vs_trainer", "--synthetic", "--arch", "roberta-large", "--precision",
               "bf16", "--out", str(out), *flags]  # last: flags may end in train.py's overrides, after --
    sub_run(check, line, label, command, timeout=timeout)
    document = json.loads(out.with_suffix(".json").read_text())
    keep_benchmark(check, label, document, out.with_suffix(".md").read_text())
    systems = document["systems"]
    return {system: {"tokens_per_second": round(row["tokens_per_second"]),
                     "examples_per_second": round(row["examples_per_second"], 1),
                     "eval_examples_per_second": round(row["eval_examples_per_second"], 1),
                     "mfu": None if row.get("mfu") is None else round(row["mfu"], 4),
                     "peak_memory_gib": round(row["peak_memory_bytes"] / 2**30, 2),
                     "wall_seconds": round(row["wall_seconds"], 1)} for system, row in systems.items()}


def keep_benchmark(check: Check, label: str, document: Dict[str, Any], markdown: str) -> None:
    """One benchmark's output added to the report's benchmarks.json (LABEL: its JSON) and benchmarks.md."""
    with check.lock:
        check.out.mkdir(parents=True, exist_ok=True)
        path = check.out / "benchmarks.json"
        kept = json.loads(path.read_text()) if path.exists() else {}
        kept[label] = document
        atomic_write(path, json.dumps(kept, indent=2) + "\n")
        atomic_write(check.out / "benchmarks.md", "\n".join(f"## {name}\n\n{kept_md}" for name, kept_md in
                                                               {**check.benchmark_md, label: markdown}.items()))
        check.benchmark_md[label] = markdown


def line_vs_trainer(check: Check, line: Line) -> None:
    """The synthetic roberta-large benchmark, ours against the tuned Trainer, bf16: tokens/s and MFU."""
    if not check.gpu:
        raise Skipped("no GPU")
    line.figures.update(vs_trainer(check, line, "vs_trainer", ["--steps", "100", "--synthetic-size", "4096",
                                                               "--systems", "ours", "hf-tuned"], timeout=330))
    require(all(row["mfu"] for row in line.figures.values()),
            "no MFU: this GPU has no peak in benchmarks.vs_trainer.PEAK_FLOPS")
    line.detail = ("both systems ran; MFU from the device's dense bf16 peak (the report's benchmarks.json and .md, "
                   "under vs_trainer)")


def line_mfu(check: Check, line: Line) -> None:
    """Line g at 512 pairs a step, 16 times its batch: 32 pairs of about 40 tokens leave the GPU idle while
    the host runs 24 layers' Python and launches; how near the issue's 40% MFU more tokens a step come."""
    if not check.gpu:
        raise Skipped("no GPU")
    line.figures.update(vs_trainer(check, line, "vs_trainer_512", ["--steps", "30", "--batch-size", "512",
                                                                   "--synthetic-size", "4096", "--systems", "ours",
                                                                   "hf-tuned"], timeout=240))
    line.detail = "both systems ran at 512 pairs a step (benchmarks.json and .md, under vs_trainer_512)"


def line_workers(check: Check, line: Line) -> None:
    """Ours as in line g with data.num_workers at its GPU default (2) and at 0, the Trainer's: whether workers
    pay in training, and what starting them costs an evaluation of four batches (line g's evaluation ran at
    a sixth of the Trainer's examples/s on the first GPU check)."""
    if not check.gpu:
        raise Skipped("no GPU")
    flags = ["--steps", "100", "--synthetic-size", "4096", "--systems", "ours"]
    line.figures["workers_2"] = vs_trainer(check, line, "workers_2", flags, timeout=150)["ours"]
    line.figures["workers_0"] = vs_trainer(check, line, "workers_0", [*flags, "--", "data.num_workers=0"],
                                           timeout=150)["ours"]
    line.detail = "measured: training and evaluation examples/s, and the whole run, with two workers and none"


def line_presets(check: Check, line: Line) -> None:
    """Every GPU hw preset x recipe, as benchmarks.memory enumerates them (the micro-batch the composed
    config gives, the recipe's sequence length, the dtype precision=auto picks on that GPU): the
    recipe's architecture with random weights, every example full length, three optimizer steps on
    this GPU; the measured peak (plus benchmarks.memory's allowances for the CUDA context and, where
    the preset runs several processes, NCCL's buffers) against the card's memory."""
    if not check.gpu:
        raise Skipped("no GPU")
    budget = min(180.0, check.left() - 60)  # the rest: composing the pairs, and the last measurement
    if budget < 20:
        raise OutOfTime(f"not started: the check's --budget had {max(check.left(), 0):.0f} s left")
    proc = sub_run(check, line, "measure", [sys.executable, "-m", "benchmarks.gpu_check", "measure-presets",
                                            "--budget", str(int(budget))], timeout=budget + 60)
    rows = [json.loads(text) for text in proc.output.splitlines() if text.startswith("{")]
    over = [f"{r['hw']} {r['recipe']}" for r in rows
            if r.get("oom") or r.get("need") is not None and r["need"] > r["card_memory"]]
    line.figures.update(rows=len(rows), measured=sum(r.get("need") is not None for r in rows),
                        does_not_fit=over, table=[preset_cell(r) for r in rows])
    require(any(r.get("need") is not None for r in rows), "no preset measured")
    require(not over, f"{len(over)} preset x recipe pair(s) do not fit their card: " + ", ".join(over))
    line.detail = ("each pair measured fits its card (peak reserved + context allowance; the rest are listed "
                   "unmeasured, with why); other cards' kernels and workspaces differ a little from this GPU's")


def preset_cell(row: Dict[str, Any]) -> str:
    """One pair, short: hw recipe batch x length dtype: GiB needed of the card's (or why not measured)."""
    head = f"{row['hw']} {row['recipe']} {row['micro_batch']}x{row['length']} {row['dtype']}"
    if row.get("need") is None:
        return f"{head}: {row.get('skipped')}"
    return f"{head}: {row['need'] / 2**30:.1f} of {row['card_memory'] / 2**30:.0f} GiB"


def measure_presets(budget: float) -> None:
    """Print one JSON line per GPU preset x recipe (benchmarks.memory's enumeration), each shape measured
    once, the smallest cards first (where a batch is most likely not to fit), until ``budget`` seconds."""
    import torch

    from benchmarks import memory
    from nli.config.command import compose
    from nli.errors import UserError

    start = time.monotonic()
    presets = memory.gpu_presets()
    hardware = {hw: compose([f"hw={hw}"]).hw for hw in presets}
    pairs = []
    for recipe in memory.model_recipes():
        base, overrides = compose([f"experiment={recipe}"]), memory.hw_overrides(recipe)
        for hw in presets:
            try:
                cfg = memory.with_preset(base, hardware[hw], overrides)
            except UserError:  # a pair the config refuses: benchmarks.memory lists those
                continue
            pairs.append((hw, recipe, cfg))
    pairs.sort(key=lambda pair: (memory.CARDS[pair[2].hw.gpu].memory, pair[1], pair[0]))
    measured: Dict[Any, Any] = {}
    for hw, recipe, cfg in pairs:
        shape, card = memory.shape_of(cfg), memory.CARDS[cfg.hw.gpu]
        row: Dict[str, Any] = {"hw": hw, "recipe": recipe, "card_memory": card.memory, "micro_batch": shape.batch,
                               "length": shape.length, "dtype": shape.dtype, "processes": cfg.hw.data_parallel_size}
        if shape not in measured and time.monotonic() - start < budget:
            measured[shape] = measure_shape(shape, fused=getattr(cfg.optimizer, "fused", True))
        peak = measured.get(shape)
        if peak is None:
            row["skipped"] = "not measured: out of the line's time"
        elif "error" in peak:
            row["skipped"] = peak["error"]
            # Out of memory on a GPU at least as large as the pair's card: it cannot fit that card either.
            row["oom"] = peak.get("oom", False) and card.memory <= torch.cuda.mem_get_info()[1]
        else:
            several = cfg.hw.data_parallel_size > 1
            extra = memory.CONTEXT + (memory.NCCL if several else 0)  # DDP's buckets are the gradients
            row.update(peak, need=peak["reserved"] + extra)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


def measure_shape(shape: Any, *, fused: bool) -> Dict[str, Any]:
    """Three training steps of ``shape`` (a benchmarks.memory.Shape) on this GPU: peak bytes allocated and
    reserved by torch's allocator, and the trained weights; or why it could not run here."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from benchmarks.architectures import hub_config
    from nli.model.build import checkpointing

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    changes: Dict[str, Any] = {"num_labels": shape.num_labels,
                               "problem_type": "regression" if shape.num_labels == 1 else "single_label_classification"}
    if shape.dropout is not None:  # as nli.model.build sets model.dropout
        changes.update(hidden_dropout_prob=shape.dropout, attention_probs_dropout_prob=shape.dropout)
    try:
        config = hub_config(shape.model, **changes)
        with torch.device("cuda"):
            model = AutoModelForSequenceClassification.from_config(config, attn_implementation=shape.attention)
        if shape.checkpointing:  # as nli.recipe enables it, before the adapters
            checkpointing(model)(use_reentrant=False)
        if shape.lora is not None:
            from nli.config.schema import LoraConfig
            from nli.model.lora import apply

            r, alpha, dropout, targets = shape.lora
            model = apply(model, LoraConfig(r=r, alpha=alpha, dropout=dropout,
                                            target_modules=None if targets is None else list(targets)))
        model.train()
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trained, lr=1e-5, fused=fused)
        scaler = torch.amp.GradScaler("cuda", enabled=shape.dtype == "fp16")
        ids = torch.randint(5, int(config.vocab_size), (shape.batch, shape.length), device="cuda")
        labels = (torch.rand(shape.batch, device="cuda") if shape.num_labels == 1
                  else torch.randint(0, shape.num_labels, (shape.batch,), device="cuda"))
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(shape.dtype)
        for _ in range(3):
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return {"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
                "trainable": sum(p.numel() for p in trained)}
    except torch.OutOfMemoryError:
        return {"error": f"out of memory on this GPU ({torch.cuda.mem_get_info()[1] / 2**30:.0f} GiB)", "oom": True}
    except Exception as error:  # a shape this machine's transformers cannot build: say so, measure the rest
        return {"error": f"{type(error).__name__}: {str(error)[:200]}"}


