"""The GPU check: what this project has never done on a GPU, done in one short run on one, each line
reported pass, fail or skipped with its figures and its time, as JSON and Markdown.

The GPU machines it is meant for are offline and short-lived (minutes), with torch, transformers and
most of their company preinstalled but no Hydra and no datasets. So it comes in two commands:

    python -m benchmarks.gpu_check prepare              # here, with the package index: the kit, into .gpu-kit/
    python3 -m benchmarks.gpu_check run --out gpu-check    # there, from the repository root, offline

``prepare`` downloads the wheels that requirements/gpu-check.txt pins (``--python-version`` for another
Python; 3.12 is the GPU machines') and prints their sizes. ``run`` installs them into the kit with pip
(no index, no dependencies; unpacked by hand where pip is missing) and runs every line, each in processes of its
own with a time limit, stopped whole (SIGTERM, then SIGKILL, torchrun's workers too) past it, so that a line that
fails or hangs costs only itself; all of it within ``--budget`` seconds (450: for a device call of about 590 s),
after which lines read "skipped: out of time". The report, at most five files straight in ``--out``
(:data:`REPORT_FILES`), is rewritten as each line ends, so what finished is there even if the machine is taken
back, and a SIGTERM to the check stops its sub-runs and writes it. ``--device cpu`` rehearses the lines a CPU
can run (the GPU-only ones are reported "skipped: no GPU", never passed):

    python -m benchmarks.gpu_check run --out gpu-check --device cpu --only quickstart_bf16 eval_only resume

Lines: the quickstart in bf16 and fp16; ``train.compile=true`` and its recompilations; an
evaluation-only run of a run folder with and without the fast paths; SIGTERM and resume against
unbroken runs; a CUDA out-of-memory backed off into smaller micro-batches; torchrun with one process;
the synthetic roberta-large benchmark against the tuned Trainer (tokens/s, MFU), again at 512 pairs a
step, and ours with DataLoader workers and without; every GPU hw preset x
recipe (benchmarks.memory's enumeration) measured against its card's memory; an fp16-stored checkpoint
trained in bf16 and fp16; gradient checkpointing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

# Nothing heavy at the top: the parent process must start before the kit is installed (no Hydra yet)
# and must not hold the GPU (no torch.cuda here); every measurement runs in a child process.

STARTED = time.monotonic()  # the check's clock: its --budget counts from here, the kit's install and start-up in it
ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements" / "gpu-check.txt"
KIT = ROOT / ".gpu-kit"
KIT_LIMIT = 64 * 2**20  # what a device run may carry beside the working tree
GPU_PYTHON = "3.12"  # the GPU machines' Python
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# The default --budget, for a device call of about 590 s: the kit's install and the environment probe inside it
# (20-30 s under gVisor), at most KILL_GRACE and the stop of what runs at the deadline after it, and the watchdog's
# WATCHDOG beyond that should that fail; about 100 s left for the call's own start-up, the copy of --out, and
# a slower machine.
BUDGET = 450.0
TAIL = 6000  # characters of a failed sub-run's output kept in the report's logs.txt
# The report's folder: these files and no others, so that a device run that brings back a handful of files brings
# back all of it (a folder of its own, nothing below it): the report, the speed lines' benchmark output (each
# benchmarks.vs_trainer --out, gathered), and the tail of each failed sub-run's output.
REPORT_FILES = ("gpu_check.json", "gpu_check.md", "benchmarks.json", "benchmarks.md", "logs.txt")

Figures = Dict[str, Any]


# ----------------------------------------------------------------------------------------- prepare


def pins(path: Path = REQUIREMENTS) -> List[str]:
    """The ``name==version`` lines of the kit's requirements, comments dropped."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def wheel_name(pin: str) -> str:
    """The prefix of ``pin``'s wheel file: ``antlr4-python3-runtime==4.9.3`` -> ``antlr4_python3_runtime-4.9.3``."""
    name, version = pin.split("==")
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}"


def fetch(pin: str, dest: Path, python_version: str) -> Path:
    """One wheel for that Python on x86-64 Linux; a pure-Python wheel built here where the index holds
    only a source distribution (antlr4 4.9.3): pip download first, pip wheel if that finds nothing."""
    before = set(dest.glob("*.whl"))
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                "--python-version", python_version, "--implementation", "cp",
                *[arg for platform in PLATFORMS for arg in ("--platform", platform)], "-d", str(dest), pin]
    if subprocess.run(download, capture_output=True, text=True).returncode != 0:
        build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dest), pin],
                               capture_output=True, text=True)
        if build.returncode != 0:
            sys.exit(f"{pin}: neither a wheel nor a buildable source distribution:\n{build.stderr[-2000:]}")
    found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(wheel_name(pin))]
    if not found:
        new = sorted(w.name for w in set(dest.glob("*.whl")) - before)
        sys.exit(f"{pin}: pip reported success but no wheel of it is in {dest} (new there: {new})")
    built = found[0]
    if "-none-any" not in built.name and f"cp{python_version.replace('.', '')}" not in built.name \
            and f"py{python_version.replace('.', '')}" not in built.name:
        sys.exit(f"{pin}: {built.name} is not for Python {python_version}")
    return built


def prepare(kit: Path, python_version: str) -> List[Path]:
    """The kit's wheels in ``kit/wheels``, stale ones removed; their total size printed."""
    dest = kit / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    wheels = [fetch(pin, dest, python_version) for pin in pins()]
    for stale in set(dest.glob("*.whl")) - set(wheels):
        stale.unlink()
    total = sum(w.stat().st_size for w in wheels)
    for wheel in sorted(wheels):
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    print(f"{total / 2**20:8.2f} MiB  in all, {len(wheels)} wheels for Python {python_version} in {dest}")
    if total > KIT_LIMIT:
        sys.exit(f"the kit is {total / 2**20:.1f} MiB: more than the {KIT_LIMIT // 2**20} MiB a device run carries")
    return wheels


class KitError(Exception):
    """The kit could not be installed: the report says why, and the lines that need it fail naming what is missing."""


def install(kit: Path) -> Tuple[Optional[Path], str]:
    """The kit's wheels installed into ``kit/site-pyXY``, that folder (for PYTHONPATH) and how: with pip (no index, no
    dependencies), else, where pip fails or is missing (a virtual environment made without it), each wheel unpacked
    there (:func:`unpack`: the kit's wheels are pure Python). None where the kit holds no wheels (a machine whose
    environment has everything). Raises KitError where neither works, or the wheels are for another Python."""
    wheels = sorted((kit / "wheels").glob("*.whl"))
    if not wheels:
        return None, f"none: no wheels in {kit / 'wheels'} (the machine's own packages)"
    site = kit / f"site-py{sys.version_info.major}{sys.version_info.minor}"
    stamp = site / ".installed"
    names = "\n".join(w.name for w in wheels)
    if stamp.exists() and stamp.read_text() == names:
        return site, f"{len(wheels)} wheels, installed before into {site}"
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    foreign = [w.name for w in wheels if re.search(r"-(py|cp)3\d+-", w.name) and f"-{tag}-" not in w.name
               and f"-cp{tag[2:]}-" not in w.name]
    if foreign:
        raise KitError(f"the kit in {kit} is for another Python than this {platform_python()}: {foreign}; `python "
                       f"-m benchmarks.gpu_check prepare --python-version {platform_python()}` makes one for it")
    shutil.rmtree(site, ignore_errors=True)
    try:
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                              "--no-compile", "--target", str(site), *map(str, wheels)], capture_output=True,
                             text=True, timeout=180)
        failed = pip.returncode != 0 and last_line(pip.stderr)
    except subprocess.TimeoutExpired:
        failed = "pip ran past 180 s"
    how = f"{len(wheels)} wheels, with pip, into {site}"
    if failed:
        shutil.rmtree(site, ignore_errors=True)
        try:
            for wheel in wheels:
                unpack(wheel, site)
        except (OSError, zipfile.BadZipFile) as error:
            raise KitError(f"installing the kit from {kit / 'wheels'} failed: pip: {failed}; unpacking the wheels: "
                           f"{type(error).__name__}: {error}") from error
        how = f"{len(wheels)} wheels, unpacked into {site} (pip: {failed})"
    stamp.write_text(names)
    return site, how


def unpack(wheel: Path, site: Path) -> None:
    """A pure-Python wheel installed by hand: its files into ``site``, those of its ``.data/purelib`` and
    ``.data/platlib`` too, its scripts and headers left out (nothing here runs them)."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            name = member.filename
            if ".data/" in name.split("/", 1)[0] + "/":
                parts = name.split("/", 2)
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                name = parts[2]
            target = (site / name).resolve()
            if not target.is_relative_to(site.resolve()):
                raise OSError(f"{wheel.name}: {member.filename} would land outside {site}")
            if member.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(member))


def platform_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


# --------------------------------------------------------------------------------------- sub-runs


@dataclass
class Line:
    """One line of the report."""

    name: str
    title: str
    status: str = "not run"  # pass, fail, skipped: why
    figures: Figures = field(default_factory=dict)
    seconds: float = 0.0
    detail: str = ""  # what passing means here, or why it failed
    logs: List[str] = field(default_factory=list)  # log files of its failed sub-runs, relative to the report


@dataclass
class Check:
    """What every line needs: where to write, which device, the environment of its processes."""

    out: Path  # the report and failed sub-runs' log tails: small, as a device run brings back
    work: Path  # run folders, checkpoints, data: gigabytes, left behind
    device: str  # cuda or cpu
    env: Dict[str, str]
    deadline: float  # time.monotonic() after which no sub-run starts, and those running are stopped
    lock: threading.RLock = field(default_factory=threading.RLock)
    stopping: threading.Event = field(default_factory=threading.Event)  # the check was told to stop (SIGTERM)
    running: Set["subprocess.Popen[bytes]"] = field(default_factory=set)  # sub-runs under way, to stop at the end
    benchmark_md: Dict[str, str] = field(default_factory=dict)  # benchmarks.md's sections, by label
    lines: Dict[str, "Line"] = field(default_factory=dict)  # the report's lines, by name: what a line depends on
    stopped_by: Optional[str] = None  # the signal that told the check to stop

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    def hw(self) -> List[str]:
        return ["hw=auto"] if self.gpu else ["hw=cpu"]

    def left(self) -> float:
        return self.deadline - time.monotonic()


class Failed(Exception):
    """A line's failure, with what to report."""


class Skipped(Exception):
    """A line this device cannot run, with why."""


class OutOfTime(Exception):
    """A line the check's --budget cut (or the check's own stop, SIGTERM): reported "skipped: out of time", its
    figures so far kept; never a failure, since what it tests did not get to run."""


@dataclass
class Proc:
    """A finished sub-run: exit status, its output, and the run folder's results where it wrote them."""

    returncode: int
    output: str
    results: Optional[Dict[str, Any]]
    folder: Optional[Path]


KILL_GRACE = 5.0  # seconds from a stopped sub-run's SIGTERM to the SIGKILL of what is left of it
MIN_START = 10.0  # seconds of the budget below which no sub-run starts


def descendants(pid: int) -> List[int]:
    """Every process below ``pid`` (from /proc's parent links), whatever its session: torchrun starts each worker in
    a session of its own, which a signal to torchrun's process group does not reach."""
    children: Dict[int, List[int]] = {}
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:  # no /proc (not Linux): the process groups alone are signalled
        return []
    for entry in entries:
        if entry.name.isdigit():
            try:
                # the field after the command's name, which may hold spaces and brackets
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child_pid in children.get(todo.pop(), []):
            found.append(child_pid)
            todo.append(child_pid)
    return found


def _signal_all(pids: Set[int], groups: Set[int], signum: int) -> None:
    for group in groups - {os.getpgrp()}:
        try:
            os.killpg(group, signum)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        return not (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def stop_tree(proc: "subprocess.Popen[bytes]", grace: float = KILL_GRACE) -> None:
    """Stop a sub-run and everything it started: SIGTERM to its process group and to each of its descendants' groups
    (torchrun's workers: sessions of their own), then, ``grace`` seconds on, SIGKILL to whatever of them is left,
    those that ignore SIGTERM too; returns once the sub-run itself has ended."""
    pids = {proc.pid, *descendants(proc.pid)}
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except OSError:
            pass
    _signal_all(pids, groups, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and (proc.poll() is None or any(_alive(pid) for pid in pids - {proc.pid})):
        pids |= set(descendants(proc.pid)) if proc.poll() is None else set()
        time.sleep(0.1)
    if proc.poll() is None:
        pids |= set(descendants(proc.pid))
    _signal_all(pids, groups, signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + 5.0  # a killed process holds its memory (the GPU's too) until it has gone
    while time.monotonic() < end and any(_alive(pid) for pid in pids):
        time.sleep(0.05)


@dataclass
class Ended:
    """How a sub-run ended: its exit status (negative: the signal that ended it), and whether the check stopped it
    (``timeout``: its own limit; ``budget``: the check's --budget; ``stop``: the check was told to stop)."""

    returncode: int
    stopped: Optional[str]
    seconds: float

    def why(self, label: str, limit: float) -> Optional[Exception]:
        """What to raise for it, or None where it exited 0."""
        if self.stopped in ("budget", "stop"):
            cause = "the check was told to stop" if self.stopped == "stop" else "the check's --budget ended"
            return OutOfTime(f"{label}: {cause} {self.seconds:.0f} s into it; stopped")
        if self.stopped == "timeout":
            return Failed(f"{label}: timed out: still running at its own limit of {limit:.0f} s (stopped: SIGTERM, "
                          f"then SIGKILL {KILL_GRACE:.0f} s on)")
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = "an unknown signal"
            return Failed(f"{label}: killed by {name} (signal {-self.returncode}) after {self.seconds:.0f} s, "
                          "not by the check (the kernel's out-of-memory killer sends SIGKILL)")
        if self.returncode != 0:
            return Failed(f"{label}: exit {self.returncode}")
        return None


def launch(check: Check, command: Sequence[str], stdout: Any, stderr: Any = subprocess.STDOUT,
           env: Optional[Dict[str, str]] = None) -> "subprocess.Popen[bytes]":
    """``command`` from the repository root, in a session of its own (so that it can be stopped whole), counted among
    the check's running sub-runs; OutOfTime where the budget has less than MIN_START seconds left."""
    if check.stopping.is_set() or check.left() < MIN_START:
        raise OutOfTime("not started: the check's --budget had " + f"{max(check.left(), 0):.0f} s left")
    proc = subprocess.Popen(list(command), cwd=ROOT, stdout=stdout, stderr=stderr,
                            env={**check.env, **(env or {})}, start_new_session=True)
    with check.lock:
        check.running.add(proc)
    return proc


def await_end(check: Check, proc: "subprocess.Popen[bytes]", timeout: float,
              until: Optional[Callable[[], bool]] = None) -> Ended:
    """Wait for ``proc`` at most ``timeout`` seconds and never past the check's deadline or its stop, then stop it
    whole (:func:`stop_tree`); or until ``until()`` is true (it is then left running: ``stopped`` is None and
    ``returncode`` is 0)."""
    start = time.monotonic()
    end = start + min(timeout, max(check.left(), 0))
    stopped: Optional[str] = None
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if until is not None and until():
                return Ended(0, None, now - start)
            if check.stopping.is_set():
                stopped = "stop"
            elif now >= end:
                stopped = "budget" if check.left() <= 0 else "timeout"
            if stopped:
                stop_tree(proc)
                break
            time.sleep(min(0.1, max(end - now, 0.01)))
    finally:
        if proc.poll() is not None:
            with check.lock:
                check.running.discard(proc)
    return Ended(proc.returncode, stopped, time.monotonic() - start)


def sub_run(check: Check, line: Line, label: str, command: Sequence[str], *, timeout: float,
            folder: Optional[Path] = None, env: Optional[Dict[str, str]] = None) -> Proc:
    """Run ``command`` from the repository root with the check's environment, at most ``timeout``
    seconds (and never past the check's deadline); where it fails, its output's tail goes into the report's
    logs.txt (:func:`keep_log`). Raises Failed (its own time limit, a signal, an exit status other than 0, no
    results) or OutOfTime."""
    log = check.work / "logs" / f"{line.name}-{label}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as sink:
        proc = launch(check, command, sink, env=env)
        ended = await_end(check, proc, timeout)
    output = log.read_text(errors="replace")
    results = None
    problem = ended.why(label, timeout)
    if problem is None and folder is not None and (folder / "results.json").is_file():
        results = json.loads((folder / "results.json").read_text())
    if problem is None and results is None and folder is not None:
        problem = Failed(f"{label}: exit 0 without {folder.name}/results.json")
    log.unlink()
    if problem is not None:
        keep_log(check, line, f"{line.name}-{label}", output)
        raise type(problem)(f"{problem}; last line: {last_line(output)}")
    return Proc(ended.returncode, output, results, folder)


def keep_log(check: Check, line: Line, name: str, output: str) -> None:
    """A failed sub-run's output, its last TAIL characters (what a reader needs; the whole may be megabytes), added
    to the report's logs.txt under ``name``, which the line's ``logs`` lists."""
    with check.lock:
        check.out.mkdir(parents=True, exist_ok=True)
        with open(check.out / "logs.txt", "a") as logs:
            logs.write(f"===== {name} =====\n{output[-TAIL:].rstrip()}\n\n")
        line.logs.append(f"logs.txt: {name}")


def last_line(output: str) -> str:
    """The output's last line that says something (not Hydra's hint about HYDRA_FULL_ERROR)."""
    lines = [line for line in output.strip().splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]
    return lines[-1][-300:] if lines else "(no output)"


def train_command(check: Check, overrides: Sequence[str], folder: Path, *, torchrun: bool = False) -> List[str]:
    """``python train.py OVERRIDES`` (or torchrun with one process: torch.distributed.run is its module)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"] \
        if torchrun else [sys.executable]
    return [*launcher, str(ROOT / "train.py"), *check.hw(), *overrides, "train.progress_bar=false",
            f"hydra.run.dir={folder}"]


def train(check: Check, line: Line, label: str, overrides: Sequence[str], *, timeout: float = 240,
          env: Optional[Dict[str, str]] = None, torchrun: bool = False, fresh: bool = True) -> Proc:
    """train.py in the folder ``runs/<line>-<label>``, emptied first unless not ``fresh`` (a resume)."""
    folder = check.work / "runs" / f"{line.name}-{label}"
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    command = train_command(check, overrides, folder, torchrun=torchrun)
    return sub_run(check, line, label, command, timeout=timeout, folder=folder, env=env)


def training_figures(results: Dict[str, Any]) -> Figures:
    """What a training run's results.json says about it, rounded for the table."""
    return {"loss": round(results["loss"], 4), "accuracy": round(results["accuracy"], 4),
            "examples_per_second": round(results["train_examples_per_second"], 1),
            "peak_memory_gib": round(results["peak_memory_bytes"] / 2**30, 3)}


def require(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)


def log_says(output: str, pattern: str) -> Optional[str]:
    """The first log line matching ``pattern`` (the run's own words, for the report)."""
    found = re.search(rf"^.*{pattern}.*$", output, re.M)
    return found.group(0).split(" - ", 1)[-1].strip() if found else None


# ------------------------------------------------------------------------------------------ lines

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
    require(math.isfinite(proc.results["loss"]), f"loss {proc.results['loss']} is not finite")
    require(proc.results["accuracy"] >= 0.5, f"accuracy {proc.results['accuracy']:.4f} < 0.5 (chance: 0.33)")
    line.detail = ("finite loss and accuracy >= 0.5 (3 classes; the README's CPU run: about 0.9); examples/s "
                   "with other lines beside it on the device: a smoke figure, not a benchmark")


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
    from nli.config.schema import compose
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


def line_fp16_checkpoint(check: Check, line: Line) -> None:
    """A checkpoint stored in fp16, trained in bf16 and fp16: no crash, float32 exported weights."""
    source = check.work / "runs" / "fp16-checkpoint-source"
    sub_run(check, line, "make", [sys.executable, "-m", "benchmarks.gpu_check", "make-fp16-checkpoint", str(source)],
            timeout=120)
    for precision in ("bf16", "fp16"):
        if precision == "fp16" and not check.gpu:
            line.figures["fp16"] = "skipped: no GPU"
            continue
        proc = train(check, line, precision, ["task=rte", f"data.dir={source / 'glue'}",
                                              f"model.name_or_path={source / 'model'}", f"precision={precision}",
                                              "data.max_seq_length=128", "train.max_steps=20", "train.batch_size=32",
                                              "train.eval_every=20", "logger=none"])
        assert proc.results is not None and proc.folder is not None
        dtypes = stored_dtypes(proc.folder / "model" / "model.safetensors")
        line.figures[precision] = {"loss": proc.results["loss"], "exported_dtypes": dtypes}
        require(math.isfinite(proc.results["loss"]), f"{precision}: loss {proc.results['loss']} is not finite")
        require(dtypes == ["float32"], f"{precision}: exported weights are {dtypes}, not float32")
    line.detail = "each run completed with a finite loss and float32 exported weights"


def stored_dtypes(path: Path) -> List[str]:
    """The dtypes of a safetensors file's tensors, from its header (no torch needed)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
    return sorted({names.get(t["dtype"], t["dtype"]) for k, t in header.items() if k != "__metadata__"
                   and t["dtype"].startswith(("F", "BF"))})


def make_fp16_checkpoint(folder: Path) -> None:
    """A random tiny RoBERTa and its tokenizer saved in float16, with RTE-layout files to train it on."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from benchmarks.mnli_like import write_glue_folder, write_random_model

    texts = write_glue_folder(folder / "glue" / "RTE", train=640, dev=64)
    write_random_model(folder / "model", architecture="tiny", texts=texts, max_seq_length=128)
    model = AutoModelForSequenceClassification.from_pretrained(folder / "model").to(torch.float16)
    model.save_pretrained(folder / "model")
    stored = stored_dtypes(folder / "model" / "model.safetensors")
    assert stored == ["float16"], stored


SYNC_STEPS = 20  # training steps between the two runs whose synchronisations are compared


SYNCS = "syncs.json"  # count-syncs' counts, in the folder it is given


def line_syncs(check: Check, line: Line) -> None:
    """How often the host waits for the GPU in a training step (torch.cuda.set_sync_debug_mode), and where: a run
    of 2N steps less one of N, so that set-up and evaluations cancel out. The loop itself should wait in none
    (non-finite steps are skipped on the device); transformers' SDPA mask check waits once per forward."""
    folder = check.work / "runs" / "syncs"
    sub_run(check, line, "count", [sys.executable, "-m", "benchmarks.gpu_check", "count-syncs", str(folder)],
            timeout=240)
    found = json.loads((folder / SYNCS).read_text())  # a file: on a GPU, lines follow the counts on stdout
    if not check.gpu:  # the rehearsal runs the counting and reads it back; a CPU has nothing to wait for
        raise Skipped("no GPU (counted and read back: a CPU has no synchronisation to count)")
    per_step = {where: round((found["long"].get(where, 0) - found["short"].get(where, 0)) / SYNC_STEPS, 2)
                for where in {**found["long"], **found["short"]}}
    per_step = {where: count for where, count in sorted(per_step.items(), key=lambda item: -item[1]) if count}
    line.figures.update(syncs_per_step=round(sum(per_step.values()), 2), by_source=per_step)
    ours = {where: count for where, count in per_step.items() if where.startswith("nli/")}
    require(not ours, f"the project's own code waits for the GPU at every step: {ours}")
    line.detail = "no synchronisation per step from nli/ (others, by source, in the figures)"


def count_syncs(folder: Path) -> None:
    """Two quickstart runs in this process, of SYNC_STEPS and 2 x SYNC_STEPS steps, evaluating and logging only at
    their end, with torch's synchronisation warnings counted by the file (under the repository or a package)
    that called the synchronising operation."""
    import warnings

    import torch

    from nli.config.schema import compose
    from nli.recipe import run
    from nli.runtime.context import local

    counts: Dict[str, Dict[str, int]] = {}
    for name, steps in (("short", SYNC_STEPS), ("long", 2 * SYNC_STEPS)):
        cfg = compose(["experiment=quickstart", "hw=auto", "precision=bf16", f"train.max_steps={steps}",
                       f"train.eval_every={steps}", f"train.log_every={steps}", f"train.checkpoint_every={steps}",
                       "train.progress_bar=false", "logger=none", "train.resume=false"])
        gpu = torch.cuda.is_available()  # a rehearsal on the CPU counts nothing, and runs the rest
        if gpu:
            torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run(cfg, local(cfg, str(folder / name)))
        if gpu:
            torch.cuda.set_sync_debug_mode("default")
        sources: Dict[str, int] = {}
        for warning in caught:
            if "synchroniz" in str(warning.message):
                where = _source(warning.filename)
                sources[where] = sources.get(where, 0) + 1
        counts[name] = sources
    (folder / SYNCS).write_text(json.dumps(counts))


def _source(filename: str) -> str:
    """A file as the report names it: relative to the repository, else from its package's folder on."""
    path = Path(filename)
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    parts = path.parts
    return "/".join(parts[parts.index("site-packages") + 1:]) if "site-packages" in parts else path.name


SDPA = r"""
import json, time, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForSequenceClassification, RobertaConfig
config = RobertaConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, intermediate_size=4096,
                       vocab_size=50265, max_position_embeddings=514)
model = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa").cuda()
ids = torch.randint(5, 50000, (32, 128), device="cuda")
padded = torch.ones_like(ids)
for row, length in enumerate(torch.randint(40, 128, (32,)).tolist()):
    padded[row, length:] = 0
full = torch.ones_like(ids)
out = {}
def step(mask, backends):
    with sdpa_kernel(backends), torch.autocast("cuda", dtype=torch.bfloat16):
        model(input_ids=ids, attention_mask=mask).logits.float().sum().backward()
for name, mask in (("padded", padded), ("unpadded", full)):
    for kernel in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        try:
            step(mask, [getattr(SDPBackend, kernel)])
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(10):
                step(mask, [getattr(SDPBackend, kernel)])
            torch.cuda.synchronize()
            out[f"{name}_{kernel.lower()}_ms"] = round((time.perf_counter() - start) * 100, 2)
        except RuntimeError as error:
            out[f"{name}_{kernel.lower()}_ms"] = "refused: " + str(error).splitlines()[0][:120]
print(json.dumps(out))
"""


def line_sdpa(check: Check, line: Line) -> None:
    """Which of SDPA's kernels can run a batch with padding: transformers hands SDPA a boolean padding mask, which
    flash attention does not take (the memory-efficient kernel runs instead); a batch without padding gets no mask.
    Four roberta-large layers, forward and backward in bf16, each kernel alone, timed."""
    if not check.gpu:
        raise Skipped("no GPU")
    line.figures.update(json.loads(child(check, SDPA)))
    line.detail = "measured: the kernels each batch can use, and their time (10 forward and backward passes)"


RNG = r"""
import torch
from nli.train.checkpoint import restore_rng, rng_state
state = rng_state()
assert isinstance(state["cuda"], torch.Tensor), type(state["cuda"])
expected = torch.rand(4, device="cuda")
restore_rng(state)
assert torch.equal(torch.rand(4, device="cuda"), expected), "this GPU's generator did not come back"
state["cuda"] = [state["cuda"]] * 8  # an earlier version's checkpoint, written seeing eight GPUs
restore_rng(state)
assert torch.equal(torch.rand(4, device="cuda"), expected), "this GPU's generator from an eight-GPU list"
print("restored")
"""


def line_rng(check: Check, line: Line) -> None:
    """A checkpoint's GPU generator restored on one GPU: its own state, and an eight-GPU list from an earlier
    version (which set_rng_state_all indexed past the GPUs there)."""
    if not check.gpu:
        raise Skipped("no GPU")
    require(child(check, RNG) == "restored", "the generator did not come back")
    line.detail = "this GPU's generator restored, from its own state and from an eight-GPU list"


# --------------------------------------------------------------------------------- environment


ENVIRONMENT = r"""
import json, platform, sys
import torch, transformers
out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
       "transformers": transformers.__version__}
for name in ("huggingface_hub", "tokenizers", "datasets", "hydra", "omegaconf", "numpy", "pyarrow", "accelerate"):
    try:
        out[name] = __import__(name).__version__
    except Exception as error:
        out[name] = f"missing ({type(error).__name__}: {error})"
out["gpus_torch"] = torch.cuda.device_count()
if not torch.cuda.is_available():
    try:
        torch.cuda.init()  # says why: no driver, a driver older than this CUDA, a build without CUDA
        out["cuda_error"] = "torch.cuda.is_available() is false"
    except Exception as error:
        out["cuda_error"] = f"{type(error).__name__}: {error}"[:300]
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    out.update(device=torch.cuda.get_device_name(0), capability=".".join(map(str, torch.cuda.get_device_capability(0))),
               memory_gib=round(props.total_memory / 2**30, 1), bf16=torch.cuda.is_bf16_supported())
try:
    from nli.model.fastpaths import TRANSFORMERS
    ok = transformers.__version__ in TRANSFORMERS
    out["fast_paths"] = (f"written for transformers {TRANSFORMERS}, this is {transformers.__version__}: "
                         + ("they apply (first_token on a GPU)" if ok else "they step aside: the stock forward"))
except Exception as error:
    out["fast_paths"] = f"unknown: nli.model.fastpaths does not import ({type(error).__name__}: {error})"
print(json.dumps(out))
"""


def child(check: Check, code: str, *args: str, timeout: float = 120, what: str = "the snippet") -> str:
    """A short Python snippet in a child process (the parent never touches the GPU), at most ``timeout`` seconds and
    never past the check's deadline, stopped whole if it overstays (:func:`await_end`); its stdout's last line."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        proc = launch(check, [sys.executable, "-c", code, *args], stdout, stderr)
        ended = await_end(check, proc, timeout)
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read().decode(errors="replace"), stderr.read().decode(errors="replace")
    problem = ended.why(what, timeout)
    if problem is not None:
        raise type(problem)(f"{problem}; last line: {last_line(err)}")
    lines = out.strip().splitlines()
    if not lines:
        raise Failed(f"{what}: printed nothing; last line of its errors: {last_line(err)}")
    return lines[-1]


def nvidia_smi(check: Check) -> Figures:
    """The GPUs NVML sees (``nvidia-smi --query-gpu``, whatever CUDA_VISIBLE_DEVICES says): their count and names, or
    why nvidia-smi could not say."""
    if shutil.which("nvidia-smi") is None:
        return {"gpus_nvml": None, "nvml": "nvidia-smi: not found"}
    command = ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"]
    with tempfile.TemporaryFile() as stdout:
        try:
            proc = launch(check, command, stdout)
        except OutOfTime as why:
            return {"gpus_nvml": None, "nvml": f"nvidia-smi: {why}"}
        ended = await_end(check, proc, 30.0)
        stdout.seek(0)
        text = stdout.read().decode(errors="replace")
    problem = ended.why("nvidia-smi", 30.0)
    if problem is not None:
        return {"gpus_nvml": None, "nvml": f"{problem}; last line: {last_line(text)}"}
    gpus = [row.strip() for row in text.splitlines() if row.strip()]
    return {"gpus_nvml": len(gpus), "nvml": gpus}


def gpus_line(environment: Dict[str, Any], nvml: Figures) -> Line:
    """Line 0: the GPUs as torch sees them and as NVML (nvidia-smi) does. It fails where NVML lists a GPU that torch
    cannot use: every GPU line would otherwise be 'skipped: no GPU', on a GPU machine."""
    line = Line("gpus", "0. GPUs as torch and as NVML (nvidia-smi) see them")
    seen, listed = environment.get("gpus_torch"), nvml.get("gpus_nvml")
    line.figures.update(torch=seen, nvidia_smi=listed if listed is not None else nvml.get("nvml"),
                        CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "(not set)"))
    if listed and not seen:
        line.status = "fail"
        line.detail = (f"nvidia-smi lists {listed} GPU(s) and torch sees none: "
                       f"{environment.get('cuda_error') or environment.get('error', 'torch did not say why')}")
    elif not listed and not seen:
        line.status = f"skipped: no GPU ({nvml.get('nvml') if listed is None else 'nvidia-smi lists none'})"
    else:
        line.status = "pass"
        line.detail = (f"torch sees {seen} GPU(s), nvidia-smi {listed if listed is not None else '(no answer)'}"
                       + ("" if seen == listed else ": they differ (CUDA_VISIBLE_DEVICES, or GPUs NVML lists that "
                          "CUDA cannot use)"))
    return line


# ------------------------------------------------------------------------------------------ run

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


OUT_OF_TIME = "skipped: out of time"  # a line the check's --budget cut, or left unstarted
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
    started = STARTED
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:  # an earlier check's: this one's would be mixed with them
        (out / name).unlink(missing_ok=True)
    try:
        site, kit = install(args.kit)
    except KitError as why:  # said in the report: the lines run, and those that need the kit fail naming what
        site, kit = None, f"failed: {why}"
    path = [str(site)] if site else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "1"}  # a failed run's whole traceback, in its log
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)  # a folder named for the runs, made as --out is
    work = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=args.work))
    check = Check(out, work, "cpu", env, started + args.budget)

    def stop(signum: int, frame: Any) -> None:  # SIGTERM or SIGINT to the check: its sub-runs stopped, the report kept
        check.stopped_by = signal.Signals(signum).name
        check.stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):  # from here on: the probes below are sub-runs too
        signal.signal(signum, stop)
    environment: Dict[str, Any] = {}
    try:
        environment = json.loads(child(check, ENVIRONMENT))
        has_gpu = "device" in environment
    except (Failed, OutOfTime, ValueError) as why:  # the lines will say what is wrong; the GPU's presence must not
        environment = {"error": str(why)}          # hang on it
        try:
            has_gpu = child(check, "import torch; print(torch.cuda.is_available())") == "True"
        except (Failed, OutOfTime):
            has_gpu = False
    nvml = nvidia_smi(check)
    environment.update(nvml)
    device = args.device or ("cuda" if has_gpu else "cpu")
    if device == "cuda" and not has_gpu:
        sys.exit("--device cuda: no CUDA GPU here (torch.cuda.is_available() is false)")
    check.device = device
    chosen = choose(plan(), args.only)
    results = {"gpus": gpus_line(environment, nvml), **{name: Line(name, title) for name, title, _, _ in chosen}}
    check.lines = results
    header = {"device": environment.get("device", "CPU (a rehearsal: GPU-only lines are skipped)"),
              "ran_on": device, "budget_seconds": args.budget, "environment": environment,
              "kit": kit, "runs": str(work) if args.keep else None}

    def report() -> None:
        with check.lock:
            if check.stopped_by:
                header["stopped_by"] = check.stopped_by
            write_report(out, header, list(results.values()), time.monotonic() - started)

    watchdog = threading.Thread(target=last_resort, args=(check, results, report), daemon=True)
    watchdog.start()
    report()
    run_lines(check, chosen, args.jobs, report)
    report()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    failed = [line.name for line in results.values() if line.status == "fail"]
    print(f"GPU check on {header['device']}: {sum(line.status == 'pass' for line in results.values())} passed, "
          f"{len(failed)} failed ({', '.join(failed) or 'none'}), "
          f"{sum(line.status.startswith('skipped') for line in results.values())} skipped, "
          f"{time.monotonic() - started:.0f} s; report: {out / 'gpu_check.md'} and {out / 'gpu_check.json'}")
    return 1 if failed or header.get("stopped_by") else 0


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


def write_report(out: Path, header: Dict[str, Any], lines: List[Line], seconds: float) -> None:
    """gpu_check.json and gpu_check.md, rewritten whole (each write replaces the file atomically)."""
    document = {**header, "seconds": round(seconds, 1), "lines": [asdict(line) for line in lines]}
    atomic_write(out / "gpu_check.json", json.dumps(document, indent=2) + "\n")
    env = header["environment"]
    md = [f"# GPU check: {header['device']}", "",
          f"Ran on {header['ran_on']}" + (" (a CPU rehearsal: no GPU figures)" if header["ran_on"] == "cpu" else "")
          + f"; {seconds:.0f} s in all.", "", gpu_counts(env), "",
          "| environment | |", "|---|---|", *[f"| {key} | {value} |" for key, value in env.items()], "",
          "| line | result | figures | seconds |", "|---|---|---|---:|"]
    long: List[str] = []  # lists too long for a cell (the presets' pairs), each under its line's title
    for line in lines:
        result = line.status + (f": {line.detail}" if line.detail and line.status in ("fail", OUT_OF_TIME) else "")
        cells = []
        for key, value in line.figures.items():
            if isinstance(value, list) and len(value) > 5:
                long += ["", f"{line.title}, {key}:", "", *[f"- {item}" for item in value]]
                value = f"({len(value)} below)"
            cells.append(f"{key}={json.dumps(value) if isinstance(value, (dict, list)) else value}")
        md.append(f"| {line.title} | {result} | {'; '.join(cells)} | {line.seconds:.0f} |".replace("\n", " "))
    if str(header.get("kit", "")).startswith("failed"):
        md[4:4] = [f"**The kit** (Hydra, OmegaConf, datasets) **did not install**: {header['kit']}", ""]
    late = [line.title for line in lines if line.status == OUT_OF_TIME]
    if late:
        budget = f" (--budget {header['budget_seconds']:.0f} s)" if header.get("budget_seconds") else ""
        md[4:4] = [f"**Skipped for time**{budget}, cut or never started: " + "; ".join(late) + ".", ""]
    if header.get("stopped_by"):
        md[4:4] = [f"**The check was stopped by {header['stopped_by']}**: the lines it ran are below.", ""]
    md += ["", "What passing means, line by line:", ""]
    md += [f"- {line.title}: {line.detail}" for line in lines
           if line.detail and line.status not in ("fail", OUT_OF_TIME)]
    md += long
    logs = [log for line in lines for log in line.logs]
    if logs:
        md += ["", "Failed sub-runs' output, the tail of each, in logs.txt: " + ", ".join(log.split(": ", 1)[-1]
                                                                                 for log in logs)]
    atomic_write(out / "gpu_check.md", "\n".join(md) + "\n")


def gpu_counts(env: Dict[str, Any]) -> str:
    """The report's sentence on the GPUs, as torch and as NVML see them."""
    seen, listed = env.get("gpus_torch", "(unknown)"), env.get("gpus_nvml")
    said = f"nvidia-smi (NVML) lists {listed}" if listed is not None else f"NVML did not answer ({env.get('nvml')})"
    differ = listed is not None and seen != listed
    return (("**They differ:** " if differ else "") + f"GPUs: torch sees {seen}; {said}"
            + (f"; CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in os.environ
               else "") + (f" ({env['cuda_error']})" if differ and env.get("cuda_error") else "") + ".")


def atomic_write(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        f.write(text)
    os.replace(f.name, path)


# ----------------------------------------------------------------------------------------- main

LINES = ("oom", "quickstart_bf16", "quickstart_fp16", "eval_only", "resume", "torchrun", "fp16_checkpoint",
         "compile", "checkpointing", "syncs", "sdpa", "rng", "vs_trainer", "mfu", "workers", "presets")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="download the kit's wheels (here, with the package index)")
    prep.add_argument("--python-version", default=GPU_PYTHON, help=f"the Python they are for (default {GPU_PYTHON})")
    prep.add_argument("--kit", type=Path, default=KIT, help="writes KIT/wheels (default: .gpu-kit)")
    run = commands.add_parser("run", help="install the kit and run every line (there, offline)")
    run.add_argument("--out", type=Path, required=True, help="the report's folder (gpu_check.json, gpu_check.md)")
    run.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda where there is one; cpu: a rehearsal")
    run.add_argument("--kit", type=Path, default=KIT, help="where prepare put the wheels (default: .gpu-kit)")
    run.add_argument("--only", nargs="+", choices=LINES, help="these lines alone")
    run.add_argument("--work", type=Path, help="where the runs' folders go (default: the system's temporary "
                     "directory), apart from --out: checkpoints and weights are gigabytes")
    run.add_argument("--keep", action="store_true", help="keep the runs' folders (their path is in the report)")
    run.add_argument("--jobs", type=int, help="lines side by side on the device (default: 4 on a GPU, 1 on a CPU)")
    run.add_argument("--budget", type=float, default=BUDGET, help="seconds from the check's start (the kit's install "
                     "in them) after which no line starts, and the sub-runs still running are stopped, their lines "
                     f"'skipped: out of time' (default {BUDGET:.0f}: the whole check, its stop and report included, "
                     "in under 8 minutes, for a device call of about 10)")
    measure = commands.add_parser("measure-presets", help=argparse.SUPPRESS)
    measure.add_argument("--budget", type=float, default=180)
    make = commands.add_parser("make-fp16-checkpoint", help=argparse.SUPPRESS)
    make.add_argument("folder", type=Path)
    syncs = commands.add_parser("count-syncs", help=argparse.SUPPRESS)
    syncs.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.kit.resolve(), args.python_version)
        return 0
    if args.command == "measure-presets":
        measure_presets(args.budget)
        return 0
    if args.command == "make-fp16-checkpoint":
        make_fp16_checkpoint(args.folder)
        return 0
    if args.command == "count-syncs":
        count_syncs(args.folder)
        return 0
    if args.jobs is None:
        args.jobs = 4 if args.device != "cpu" else 1
    args.kit = args.kit.resolve()
    return main_run(args)


if __name__ == "__main__":
    sys.exit(main())
