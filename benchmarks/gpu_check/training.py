"""The GPU check's training lines: the quickstart in bf16 and fp16, ``train.compile=true``, evaluation-only with and
without the fast paths, SIGTERM and resume, a real out-of-memory, torchrun, gradient checkpointing."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import signal
from pathlib import Path
from typing import Dict, List, Optional

from benchmarks.gpu_check import Figures
from benchmarks.gpu_check.subruns import (
    Check,
    Failed,
    Line,
    OutOfTime,
    Skipped,
    await_end,
    child,
    keep_log,
    launch,
    log_says,
    require,
    train,
    train_command,
    training_figures,
)

# The quickstart as the README runs it; SHORT for the lines that only need a few dozen steps of it; ON_CPU
# for the quickstart's line where no GPU runs it (the rehearsal): 80 steps, where 40 ended at 0.56 (fp32).
QUICKSTART = ["experiment=quickstart"]
SHORT = ["experiment=quickstart", "data.synthetic_train_size=640", "data.synthetic_eval_size=96"]
ON_CPU = ["experiment=quickstart", "data.synthetic_train_size=1280", "data.synthetic_eval_size=96"]


def line_quickstart(check: Check, line: Line, precision: str) -> None:
    """The quickstart in one precision: finite loss, accuracy well above chance (1/3)."""
    if precision == "fp16" and not check.gpu:
        raise Skipped("no GPU (fp16 autocast needs CUDA)")
    proc = train(check, line, precision, [*(QUICKSTART if check.gpu else ON_CPU), f"precision={precision}"])
    assert proc.results is not None
    line.figures.update(training_figures(proc.results))
    line.figures["device"] = log_says(proc.output, "device: ") or "(no device line)"
    line.figures["fast_paths"] = log_says(proc.output, "fast paths") or "(no fast-paths line)"
    line.figures.update(scaler := scaler_figures(proc.folder))
    require(math.isfinite(proc.results["loss"]), f"loss {proc.results['loss']} is not finite")
    require(proc.results["accuracy"] >= 0.5, f"accuracy {proc.results['accuracy']:.4f} < 0.5 (chance: 0.33)")
    if check.gpu:  # the scaler runs on a GPU in every precision (nli.train.loop.grad_scaler)
        require("skipped_steps" in scaler, "no train/skipped_steps in metrics.csv: the loss scaler's count is missing")
        require(scaler["skipped_steps"] < proc.results["train_steps"] / 2,
                f"the loss scaler skipped {scaler['skipped_steps']} of {proc.results['train_steps']} steps")
    line.detail = ("finite loss and accuracy >= 0.5 (3 classes; the README's CPU run: about 0.9), the loss scaler's "
                   "skips counted and under half the steps; examples/s with other lines beside it on the device: a "
                   "smoke figure, not a benchmark")


def scaler_figures(folder: Optional[Path]) -> Figures:
    """What the loss scaler did, from the run's metrics.csv (rows of step, metric, value): the steps it skipped in
    all (train/skipped_steps, each log's since the last) and its last scale (train/loss_scale, fp16's); none where
    the run logged neither (the CPU, which has no scaler outside fp16)."""
    path = folder / "metrics.csv" if folder is not None else None
    if path is None or not path.is_file():
        return {}
    with path.open(newline="") as rows:
        logged = [(row["metric"], float(row["value"])) for row in csv.DictReader(rows)
                  if row["metric"] in ("train/skipped_steps", "train/loss_scale")]
    skipped = [value for metric, value in logged if metric == "train/skipped_steps"]
    scales = [value for metric, value in logged if metric == "train/loss_scale"]
    return {**({"skipped_steps": int(sum(skipped))} if skipped else {}),
            **({"loss_scale": scales[-1]} if scales else {})}


# dynamo's own record of its compilations, with TORCH_LOGS="recompiles,dynamo": one "Step 1: torchdynamo start
# tracing" line per compilation, one "Recompiling function F in FILE:LINE" record per recompilation (the guards that
# failed on its following lines), and "torch._dynamo hit config.recompile_limit (8)" where a frame fell back to eager
# (torch 2.1 to 2.13 word these alike: torch/_dynamo/guards.py, convert_frame.py). Each line of a record carries
# the prefix "V1204 15:25:34.990000 9022 .../guards.py:5396] [0/1] [__recompiles] ".
TRACING = re.compile(r"torchdynamo start tracing (\S+) (\S+)")
COMPILE_ID = re.compile(r"\[(\d+)/(\d+)(?:_\d+)?\]")  # [frame/its compilation], "_1" a restart of the same one
RECOMPILING = re.compile(r"Recompiling function (\S+) in (\S+)")
LIMIT_HIT = re.compile(r"torch\._dynamo hit config\.(\w+) \((\d+)\)")
GUARD_FAILURE = re.compile(r"^(?:.*\] )?\s+- (?:guard \d+ failures:)?(.+)$")
RECOMPILE_LOGS = "recompiles,dynamo"  # dynamo at INFO: a few lines a compilation, so that none logged means none


def recompilations(output: str) -> Figures:
    """What dynamo logged of a run's compilations (:data:`RECOMPILE_LOGS`): compilations, recompilations in all and
    per function, the limits it hit, and the first guard failures. Raises :class:`Failed` where it logged no
    compilation: the recompilations would then read 0 whatever happened (logging off, or nothing compiled)."""
    lines = output.splitlines()
    compiled = set()
    for text in lines:
        if TRACING.search(text):
            found = COMPILE_ID.search(text)
            compiled.add(found.groups() if found else text)
    if not compiled:
        raise Failed("dynamo logged no compilation (TORCH_LOGS=" + RECOMPILE_LOGS + "): the recompilations "
                     "cannot be counted, and 0 would be no figure")
    per_function: Dict[str, int] = {}
    reasons: List[str] = []
    for index, text in enumerate(lines):
        found = RECOMPILING.search(text)
        if found is None:
            continue
        where = f"{found.group(1)} {found.group(2)}"
        per_function[where] = per_function.get(where, 0) + 1
        for following in lines[index + 2:index + 4]:  # after "triggered by the following guard failure(s):"
            failure = GUARD_FAILURE.match(following)
            if failure is None:
                break
            if len(reasons) < 3:
                reasons.append(failure.group(1).strip())
    limits = sorted({f"{found.group(1)} ({found.group(2)})" for found in map(LIMIT_HIT.search, lines) if found})
    figures: Figures = {"compilations": len(compiled), "recompiles": sum(per_function.values()),
                        "most_recompiles_of_one_function": max(per_function.values(), default=0),
                        "limits_hit": limits}
    if per_function:
        figures["recompiles_by_function"] = per_function
    if reasons:
        figures["first_guard_failures"] = reasons
    return figures


def line_compile(check: Check, line: Line) -> None:
    """train.compile=true: its compilations and recompilations as dynamo logs them (:func:`recompilations`)."""
    if not check.gpu:
        raise Skipped("no GPU")
    proc = train(check, line, "compile", [*QUICKSTART, "train.compile=true", "train.epochs=1"], timeout=300,
                 env={"TORCH_LOGS": RECOMPILE_LOGS})
    assert proc.results is not None
    line.figures.update(training_figures(proc.results))
    line.figures.update(recompilations(proc.output))
    require(math.isfinite(proc.results["loss"]), f"loss {proc.results['loss']} is not finite")
    require(not line.figures["limits_hit"],
            f"dynamo hit {', '.join(line.figures['limits_hit'])}: a frame fell back to eager")
    line.detail = ("finite loss, and dynamo hit no recompile limit (no frame fell back to eager); compilations and "
                   "recompilations as dynamo logged them (TORCH_LOGS=" + RECOMPILE_LOGS + ")")


EVAL_TOLERANCE = 1e-4  # |loss difference| in fp32: the fast paths reorder float sums, nothing more


def line_eval_only(check: Check, line: Line) -> None:
    """An evaluation-only run of the bf16 quickstart's folder (line a, which runs before it: :data:`AFTER`), with and
    without the fast paths, in fp32."""
    source = check.lines.get("quickstart_bf16")
    if source is None or source.status != "pass":
        raise Skipped("it evaluates the bf16 quickstart's run folder, and that line "
                      + ("did not run" if source is None else f"ended '{source.status}'"))
    folder = check.work / "runs" / "quickstart_bf16-bf16"
    runs = {}
    for label, extra in (("fast", []), ("stock", ["model.fast_paths=false"])):
        proc = train(check, line, label, ["eval.only=true", f"model.name_or_path={folder}", "precision=fp32", *extra])
        assert proc.results is not None
        runs[label] = proc.results
        line.figures[f"{label}_paths"] = log_says(proc.output, "fast paths") or "none"
    fast, stock = runs["fast"], runs["stock"]
    gap = abs(fast["loss"] - stock["loss"])
    line.figures.update(accuracy=fast["accuracy"], accuracy_stock=stock["accuracy"], loss_gap=gap,
                        eval_examples_per_second=round(fast.get("eval_examples_per_second") or 0, 1))
    require(fast["accuracy"] == stock["accuracy"], f"accuracy {fast['accuracy']} with, {stock['accuracy']} without")
    require(gap <= EVAL_TOLERANCE, f"losses differ by {gap:.2e} > {EVAL_TOLERANCE}")
    line.detail = f"the same accuracy and |loss difference| <= {EVAL_TOLERANCE} (fp32)"


# The run test_resume.py stops: 20 steps an epoch, 50 in all, SIGTERM after step 23 (mid second epoch).
# Two data workers on every device (a GPU's default): the signal reaches them too, as Slurm's reaches a job step.
RESUME = [*SHORT, "train.max_steps=50", "train.eval_every=15", "train.log_every=1", "train.checkpoint_every=5",
          "precision=fp32", "data.num_workers=2"]
PREEMPTED = 75  # the exit status of a run stopped by a signal with its checkpoint written (nli.runtime.signals)


def line_resume(check: Check, line: Line) -> None:
    """SIGTERM mid-run, the same command again, against two unbroken runs (their difference is the
    device's own run-to-run noise: CUDA's embedding backward adds with atomics, in no fixed order)."""
    # On a CPU the thread count changes float rounding, and each run picks its share of the free cores:
    # fixed, the runs repeat bit for bit (docs/speed.md).
    args = RESUME if check.gpu else [*RESUME, "hw.cpu_threads=1"]
    unbroken = [train(check, line, f"unbroken{i}", args) for i in (1, 2)]
    folder = check.work / "runs" / f"{line.name}-stopped"
    shutil.rmtree(folder, ignore_errors=True)
    stopped_at = stop_after(check, line, train_command(check, args, folder), folder / "train.log", step=23)
    resumed = train(check, line, "stopped", args, fresh=False)  # the same command again: it continues
    require(resumed.folder == folder, "the resumed run ran elsewhere")
    noise = weight_gap(check, unbroken[0].folder, unbroken[1].folder)
    gap = weight_gap(check, unbroken[0].folder, folder)
    a, b = unbroken[0].results or {}, resumed.results or {}
    line.figures.update(stopped_at_step=stopped_at, relative_weight_gap=gap["relative"],
                        max_abs_weight_gap=gap["max_abs"], run_to_run_relative=noise["relative"],
                        accuracy=b.get("accuracy"), accuracy_unbroken=a.get("accuracy"),
                        loss_gap=abs(a.get("loss", math.nan) - b.get("loss", math.nan)))
    if noise["relative"] == 0:  # the device repeats itself: so must a resumed run, bit for bit
        require(gap["relative"] == 0, f"unbroken runs agree bit for bit, the resumed one differs by {gap}")
        line.detail = "bit-identical exported weights (two unbroken runs are)"
    else:
        tolerance = max(10 * noise["relative"], 1e-6)
        require(gap["relative"] <= tolerance, f"relative weight gap {gap['relative']:.2e} > {tolerance:.2e} "
                f"(10x the unbroken runs' {noise['relative']:.2e})")
        line.detail = ("exported weights within 10x the gap between two unbroken runs (relative Frobenius norm); "
                       "a resume that lost its optimizer, schedule or data position moves them by orders more")


def stop_after(check: Check, line: Line, command: List[str], log: Path, *, step: int) -> int:
    """Start ``command``, SIGTERM it once its log reaches ``step``, to its every process as Slurm sends it (its data
    workers too); the step it says it stopped at. A run that never gets there, or does not stop within two minutes
    of the signal, is stopped whole (:func:`stop_tree`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sink = check.work / "logs" / "resume-sigterm.log"
    sink.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _stop_after(check, command, log, sink, step=step)
    except (Failed, OutOfTime):
        keep_log(check, line, "resume-sigterm", sink.read_text(errors="replace") if sink.exists() else "")
        raise


def _stop_after(check: Check, command: List[str], log: Path, sink: Path, *, step: int) -> int:
    reached = lambda: f"step {step}: loss" in (log.read_text(errors="replace") if log.exists() else "")  # noqa: E731
    with open(sink, "wb") as out:
        proc = launch(check, command, out)
        ended = await_end(check, proc, 240.0, until=reached)
        if ended.stopped is None and proc.poll() is None:  # at the step: the signal, as Slurm sends it
            os.killpg(proc.pid, signal.SIGTERM)
            ended = await_end(check, proc, 120.0)
            if ended.stopped == "timeout":
                raise Failed("SIGTERM: the run had not stopped 120 s later (stopped with SIGKILL; "
                             "logs.txt: resume-sigterm)")
        elif ended.stopped is None:
            raise Failed(f"the run to stop never reached step {step} (exit {proc.returncode}; "
                         "logs.txt: resume-sigterm)")
    problem = ended.why("the run to stop", 240.0)
    if isinstance(problem, OutOfTime) or ended.stopped == "timeout":
        raise problem if isinstance(problem, OutOfTime) else Failed(f"the run to stop never reached step {step} "
                                                                     "in 240 s (logs.txt: resume-sigterm)")
    text = sink.read_text(errors="replace")
    require(ended.returncode == PREEMPTED, f"SIGTERM: exit {ended.returncode}, not {PREEMPTED} "
            "(logs.txt: resume-sigterm)")
    sink.unlink()
    found = re.search(r"SIGTERM at step (\d+)", text)
    return int(found.group(1)) if found else -1


def weight_gap(check: Check, a: Optional[Path], b: Optional[Path]) -> Dict[str, float]:
    """Two runs' exported weights: the largest absolute difference and the relative Frobenius norm."""
    code = ("import json,sys,torch;from safetensors.torch import load_file as L;"
            "a,b=L(sys.argv[1]),L(sys.argv[2]);assert a.keys()==b.keys(),'other weights';"
            "d=sum(float((a[k].double()-b[k].double()).pow(2).sum()) for k in a);"
            "n=sum(float(a[k].double().pow(2).sum()) for k in a);"
            "m=max(float((a[k].double()-b[k].double()).abs().max()) for k in a);"
            "print(json.dumps({'relative':(d/n)**0.5,'max_abs':m}))")
    assert a is not None and b is not None
    return json.loads(child(check, code, str(a / "model" / "model.safetensors"), str(b / "model" / "model.safetensors"),
                            what="comparing weights"))


def line_oom(check: Check, line: Line) -> None:
    """A per-device batch four times what the GPU holds, at 512 tokens: the run must back off into
    smaller micro-batches, say so in one line, and finish."""
    if not check.gpu:
        raise Skipped("no GPU")
    free = json.loads(child(check, "import torch,json;print(json.dumps(torch.cuda.mem_get_info()))"))[0]
    layers, hidden, seq = 8, 1024, 512
    # Activations per example and layer in bf16: about 34 x length x width bytes (Korthikanti et al.
    # 2022, table 2, without the attention matrix: SDPA keeps none).
    per_example = 34 * seq * hidden * layers
    batch = 2 ** math.ceil(math.log2(4 * free / per_example))
    data = check.work / "runs" / "oom-data"
    write_long_pairs(data / "RTE", rows=batch, dev=32, words=600)
    arch = [f"model.scratch.hidden_size={hidden}", f"model.scratch.num_hidden_layers={layers}",
            "model.scratch.num_attention_heads=16", f"model.scratch.intermediate_size={4 * hidden}",
            f"model.scratch.max_position_embeddings={seq + 2}"]
    proc = train(check, line, "run", ["model=tiny", "task=rte", f"data.dir={data}", f"data.max_seq_length={seq}",
                                      *arch, "precision=bf16", f"train.batch_size={batch}",
                                      f"hw.per_device_batch_size={batch}", "train.max_steps=1",
                                      "schedule.warmup_ratio=0",  # one step: nothing to warm up over
                                      "train.eval_batch_size=32", "optimizer=adamw", "logger=none"], timeout=300)
    assert proc.results is not None
    said = re.findall(r"out of GPU memory in a micro-batch of (\d+) examples: going on in micro-batches of (\d+)",
                      proc.output)
    line.figures.update(free_gib=round(free / 2**30, 1), asked=batch, backoffs=len(said),
                        fitted=int(said[-1][1]) if said else None, status=proc.results.get("status"),
                        peak_memory_gib=round(proc.results["peak_memory_bytes"] / 2**30, 2))
    if said:
        line.figures["log_line"] = log_says(proc.output, "out of GPU memory in a micro-batch")
    require(bool(said), f"no back-off line: a micro-batch of {batch} x {seq} tokens fitted in {free / 2**30:.0f} GiB")
    require(proc.results.get("status") == "completed", f"status {proc.results.get('status')}")
    # The failed attempt asked for more than was free: a peak that counts it was not reset
    # (nli.runtime.device.PeakMemory).
    require(proc.results["peak_memory_bytes"] < free, "peak_memory_bytes counts the attempt that did not fit")
    line.detail = "the back-off line logged, the run completed, its peak memory that of the micro-batches that fit"


def write_long_pairs(folder: Path, *, rows: int, dev: int, words: int) -> None:
    """RTE-layout files whose every pair fills the sequence length (made-up words, random labels)."""
    import random

    rng = random.Random(0)
    vocabulary = ["".join(rng.choices("abcdefghij", k=5)) for _ in range(500)]
    folder.mkdir(parents=True, exist_ok=True)
    for split, size in (("train", rows), ("dev", dev), ("test", dev)):
        lines = ["index\tsentence1\tsentence2\tlabel"]
        for index in range(size):
            label = rng.choice(["entailment", "not_entailment"])
            lines.append(f"{index}\t{' '.join(rng.choices(vocabulary, k=words))}\t"
                         f"{' '.join(rng.choices(vocabulary, k=words // 4))}\t{label}")
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")


def line_torchrun(check: Check, line: Line) -> None:
    """torchrun --nproc-per-node 1 train.py (python -m torch.distributed.run: torchrun's own module)."""
    proc = train(check, line, "run", SHORT, torchrun=True)
    assert proc.results is not None
    line.figures.update(training_figures(proc.results))
    line.figures["processes"] = proc.results.get("provenance", {}).get("device", {}).get("processes")
    require(math.isfinite(proc.results["loss"]), f"loss {proc.results['loss']} is not finite")
    line.detail = "completed under torchrun, finite loss"


def line_checkpointing(check: Check, line: Line) -> None:
    """train.gradient_checkpointing=true: transformers renamed the call that turns it on between the
    pinned 5.23 and the GPU machines' 5.17 (activation_ vs gradient_checkpointing_enable)."""
    proc = train(check, line, "run", [*SHORT, "train.gradient_checkpointing=true", "train.max_steps=20",
                                      f"precision={'bf16' if check.gpu else 'fp32'}"])
    assert proc.results is not None
    line.figures.update(training_figures(proc.results))
    require(math.isfinite(proc.results["loss"]), f"loss {proc.results['loss']} is not finite")
    line.detail = "completed with a finite loss"

