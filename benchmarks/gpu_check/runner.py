"""The GPU check's run: every line in its phase within the --budget, the report rewritten as each ends, and the
check's own stop (SIGTERM, the watchdog)."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from benchmarks.gpu_check import ROOT, STARTED
from benchmarks.gpu_check.environment import ENVIRONMENT, gpus_line, nvidia_smi
from benchmarks.gpu_check.kit import KitError, install
from benchmarks.gpu_check.probes import line_fp16_checkpoint, line_rng, line_sdpa, line_syncs
from benchmarks.gpu_check.report import REPORT_FILES, write_report
from benchmarks.gpu_check.speed import line_mfu, line_presets, line_vs_trainer, line_workers
from benchmarks.gpu_check.subruns import (
    KILL_GRACE,
    OUT_OF_TIME,
    Check,
    Failed,
    Line,
    OutOfTime,
    Skipped,
    child,
    stop_tree,
)
from benchmarks.gpu_check.training import (
    line_checkpointing,
    line_compile,
    line_eval_only,
    line_oom,
    line_quickstart,
    line_resume,
    line_torchrun,
)

# The default --budget, for a device call of about 590 s: the kit's install and the environment probe inside it
# (20-30 s under gVisor), at most KILL_GRACE and the stop of what runs at the deadline after it, and the watchdog's
# WATCHDOG beyond that should that fail; about 100 s left for the call's own start-up, the copy of --out, and
# a slower machine.
BUDGET = 450.0



LineFunction = Callable[[Check, Line], None]


# Lines that read what another line left: each starts once those have ended, and --only brings those in.
AFTER: Dict[str, Tuple[str, ...]] = {"eval_only": ("quickstart_bf16",)}
PHASES = ("first", "together", "last")


def plan() -> List[Tuple[str, str, LineFunction, str]]:
    """Every line: name, title, what it runs, and when: alone first (it fills the GPU's memory on
    purpose), side by side (small models), alone last (a speed, then the largest memory figures, with
    what time is left). A line of :data:`AFTER` waits for those it names, in its phase or an earlier one."""
    def quickstart(precision: str) -> LineFunction:
        return lambda check, line: line_quickstart(check, line, precision)

    return [
        ("oom", "e. out of GPU memory backed off", line_oom, "first"),
        ("compile", "b. train.compile=true, recompilations", line_compile, "together"),
        ("quickstart_bf16", "a. quickstart, precision=bf16", quickstart("bf16"), "together"),
        ("quickstart_fp16", "a. quickstart, precision=fp16", quickstart("fp16"), "together"),
        ("eval_only", "c. eval.only=true, fast paths on and off",
         line_eval_only, "together"),
        ("resume", "d. SIGTERM, resume, against unbroken runs", line_resume, "together"),
        ("torchrun", "f. torchrun --nproc-per-node 1", line_torchrun, "together"),
        ("fp16_checkpoint", "i. fp16-stored checkpoint, bf16 and fp16", line_fp16_checkpoint, "together"),
        ("checkpointing", "j. train.gradient_checkpointing=true", line_checkpointing, "together"),
        ("syncs", "k. host synchronisations per training step, by source", line_syncs, "together"),
        ("sdpa", "l. SDPA's kernels on padded and unpadded batches", line_sdpa, "together"),
        ("rng", "m. a checkpoint's GPU generator restored on one GPU", line_rng, "together"),
        ("vs_trainer", "g. roberta-large synthetic: ours vs tuned Trainer", line_vs_trainer, "last"),
        ("mfu", "n. roberta-large synthetic at 512 pairs a step: MFU", line_mfu, "last"),
        ("workers", "o. data.num_workers=2 against 0: training and evaluation", line_workers, "last"),
        ("presets", "h. hw presets x recipes: measured peak against card memory", line_presets, "last"),
    ]


Entry = Tuple[str, str, LineFunction, str]


def choose(entries: List[Entry], only: Optional[Sequence[str]]) -> List[Entry]:
    """The lines --only names (every line without it), and those they read from (:data:`AFTER`), in plan order."""
    wanted = set(only or [entry[0] for entry in entries])
    for name in list(wanted):
        wanted.update(AFTER.get(name, ()))
    return [entry for entry in entries if entry[0] in wanted]


def run_lines(check: Check, entries: List[Entry], jobs: int, report: Callable[[], None]) -> None:
    """Each line in its phase (:data:`PHASES`: ``together``'s ``jobs`` side by side, the others one at a time), a
    line of :data:`AFTER` only once the lines it reads from have ended; each line recorded in ``check.lines``."""
    def one(name: str, function: LineFunction) -> None:
        line = check.lines[name]
        if check.left() < 15 or check.stopping.is_set():
            why = ("the check was told to stop" if check.stopping.is_set()
                   else f"the check's --budget had {max(check.left(), 0):.0f} s left")
            line.status, line.detail = OUT_OF_TIME, f"not started: {why}"
            report()
        else:
            run_line(check, line, function, report)

    def ended(name: str) -> bool:
        return name not in check.lines or check.lines[name].status not in ("not run", "running")

    for phase in PHASES:
        waiting = [(name, function) for name, _, function, when in entries if when == phase]
        workers = max(jobs if phase == "together" else 1, 1)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            running: Set[concurrent.futures.Future] = set()
            while waiting or running:
                for entry in [entry for entry in waiting if all(map(ended, AFTER.get(entry[0], ())))]:
                    if len(running) >= workers:
                        break
                    waiting.remove(entry)
                    running.add(pool.submit(one, *entry))
                if not running:  # what they wait for is in a later phase: a plan's mistake, said as a failure
                    for name, _ in waiting:
                        check.lines[name].status = "fail"
                        check.lines[name].detail = f"waits for {AFTER.get(name)}, which run after it (the check's plan)"
                    break
                finished, running = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in finished:
                    future.result()


def run_line(check: Check, line: Line, function: LineFunction, report: Callable[[], None]) -> None:
    start = time.monotonic()
    line.status = "running"
    report()  # so that a report read mid-check says which lines were under way
    try:
        function(check, line)
        line.status = "pass"
    except Skipped as why:
        line.status = f"skipped: {why}"
    except OutOfTime as why:
        line.status, line.detail = OUT_OF_TIME, str(why)
    except Failed as why:
        line.status, line.detail = "fail", str(why)
    except Exception as error:  # a bug in the check itself: reported as this line's failure, the rest go on
        line.status, line.detail = "fail", f"{type(error).__name__}: {error}"
    line.seconds = round(time.monotonic() - start, 1)
    report()


def main_run(args: argparse.Namespace) -> int:
    """The check: the kit installed, the machine probed, every line run within the budget, the report kept."""
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:  # an earlier check's: this one's would be mixed with them
        (out / name).unlink(missing_ok=True)
    env, kit = _kit_environment(args.kit)
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)  # a folder named for the runs, made as --out is
    work = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=args.work))
    check = Check(out, work, "cpu", env, STARTED + args.budget)
    _stop_on_signals(check)  # from here on: the probes below are sub-runs too
    environment, has_gpu = _probe(check)
    nvml = nvidia_smi(check)
    environment.update(nvml)
    device = args.device or ("cuda" if has_gpu else "cpu")
    check.device = device
    chosen = choose(plan(), args.only)
    results = {"gpus": gpus_line(environment, nvml), **{name: Line(name, title) for name, title, _, _ in chosen}}
    check.lines = results
    header = {"device": environment.get("device", "CPU (a rehearsal: GPU-only lines are skipped)"),
              "ran_on": device, "budget_seconds": args.budget, "environment": environment,
              "kit": kit, "runs": str(work) if args.keep else None}
    if device == "cuda" and not has_gpu:  # a report all the same: on a GPU machine, it says what torch met there
        header["refused"] = "--device cuda: no CUDA GPU here (torch.cuda.is_available() is false)"
        for line in results.values():
            if line.status == "not run":
                line.status = "skipped: no CUDA GPU (--device cuda)"

    def report() -> None:
        with check.lock:
            if check.stopped_by:
                header["stopped_by"] = check.stopped_by
            write_report(out, header, list(results.values()), time.monotonic() - STARTED)

    threading.Thread(target=last_resort, args=(check, results, report), daemon=True).start()
    report()
    if "refused" in header:
        print(f"{header['refused']}: no line ran; report: {out / 'gpu_check.md'}", file=sys.stderr)
        return 1
    run_lines(check, chosen, args.jobs, report)
    report()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    failed = [line.name for line in results.values() if line.status == "fail"]
    print(f"GPU check on {header['device']}: {sum(line.status == 'pass' for line in results.values())} passed, "
          f"{len(failed)} failed ({', '.join(failed) or 'none'}), "
          f"{sum(line.status.startswith('skipped') for line in results.values())} skipped, "
          f"{time.monotonic() - STARTED:.0f} s; report: {out / 'gpu_check.md'} and {out / 'gpu_check.json'}")
    return 1 if failed or header.get("stopped_by") else 0


def _kit_environment(kit_dir: Path) -> Tuple[Dict[str, str], str]:
    """The sub-runs' environment, the kit installed on their path; and what became of the kit, for the report (a kit
    that failed is said there: the lines run, and those that need it fail naming what)."""
    try:
        site, kit = install(kit_dir)
    except KitError as why:
        site, kit = None, f"failed: {why}"
    path = [str(site)] if site else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "1"}  # a failed run's whole traceback, in its log
    return env, kit


def _stop_on_signals(check: Check) -> None:
    """SIGTERM or SIGINT to the check: its sub-runs stopped, the lines under way cut, the report kept."""
    def stop(signum: int, frame: Any) -> None:
        check.stopped_by = signal.Signals(signum).name
        check.stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


def _probe(check: Check) -> Tuple[Dict[str, Any], bool]:
    """The machine and its libraries (:data:`ENVIRONMENT`), and whether torch has a CUDA GPU there. A probe that
    fails is said in the report; the GPU's presence is then asked alone, so that the check does not hang on it."""
    try:
        environment = json.loads(child(check, ENVIRONMENT))
        return environment, "device" in environment
    except (Failed, OutOfTime, ValueError) as why:
        try:
            has_gpu = child(check, "import torch; print(torch.cuda.is_available())") == "True"
        except (Failed, OutOfTime):
            has_gpu = False
        return {"error": str(why)}, has_gpu


WATCHDOG = 30.0  # seconds past the deadline (and the sub-runs' KILL_GRACE) after which the check ends whatever runs


def last_resort(check: Check, results: Dict[str, Line], report: Callable[[], None]) -> None:
    """The check's own end, should a line outlast the deadline by more than its sub-runs' stop takes (a bug in the
    check, a wait with no limit): its unfinished lines reported out of time, its sub-runs stopped whole, the report
    written, the process ended."""
    while True:
        late = -check.left() - KILL_GRACE - WATCHDOG
        if late >= 0:
            break
        time.sleep(min(-late, 5.0))
    check.stopping.set()
    with check.lock:
        for line in results.values():
            if line.status in ("not run", "running"):
                line.status, line.detail = OUT_OF_TIME, ("the check's --budget ended and the line had not ended "
                                                         f"{KILL_GRACE + WATCHDOG:.0f} s later: ended with the check")
        running = list(check.running)
    for proc in running:
        stop_tree(proc, grace=1.0)
    report()
    os._exit(1)


