"""The GPU check's report lines and sub-runs: each measurement in a process of its own, with a time limit, stopped
whole (its process tree) at its deadline, its figures and the tail of its output kept."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

from benchmarks.gpu_check import ROOT, Figures

TAIL = 6000  # characters of a failed sub-run's output kept in the report's logs.txt




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


OUT_OF_TIME = "skipped: out of time"  # a line the check's --budget cut, or left unstarted


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
