"""How a run shares the CPU: how many threads it computes with, and glibc's heap.

torch starts one intra-op thread per core. On a machine that something else also uses (the user's
browser, a second run, a sweep's jobs side by side, torchrun's other ranks) each parallel region then
waits for a thread the kernel has descheduled: two quickstarts started at once on 2 cores trained at
4% of their idle speed each, and at 66% with one thread each (benchmarks/RESULTS.md). So a run
computes with its share of the cores:

    the cores it may use   physical cores in its affinity mask, capped by the container's CPU quota
                           (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``)
    shared among           the runs of this framework alive on this machine (a registry of pids in the
                           temporary directory), and at least the processes the platform places here
                           (torchrun's and submitit's local world size)
    less                   what other processes keep busy on those cores (``/proc/stat``)

decided at start over the seconds the imports take, and looked at again every few seconds of
training (:class:`Threads`, a hook), so that a run or a busy process that starts or ends beside it
changes the count. ``hw.cpu_threads`` fixes the count, and so does ``OMP_NUM_THREADS``.

Light on purpose (no torch at import): the entry point starts the registry and the first sample
before torch loads.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Set

log = logging.getLogger(__name__)

PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc counts CPU time in clock ticks
REVISIT_SECONDS = 10.0  # how often training looks at the machine again
M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


# ----------------------------------------------------------------------------------------- cores


@dataclass(frozen=True)
class Cores:
    """The cores this process may compute on."""

    cpus: Set[int]  # logical CPUs in the affinity mask
    physical: int  # distinct physical cores among them (hyperthreads of one core count once)
    quota: Optional[float]  # the container's CPU quota in cores; None: no limit

    @property
    def usable(self) -> float:
        return min(float(self.physical), self.quota) if self.quota is not None else float(self.physical)

    def describe(self) -> str:
        quota = f", quota {self.quota:g}" if self.quota is not None else ""
        return f"{self.physical} core(s) in the affinity mask{quota}"


def find_cores(sys_cpu: Path = Path("/sys/devices/system/cpu"), cgroup: Path = CGROUP,
               proc: Path = PROC) -> Cores:
    cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    return Cores(cpus, physical_cores(cpus, sys_cpu), cgroup_quota(cgroup, proc / "self" / "cgroup"))


def physical_cores(cpus: Set[int], sys_cpu: Path) -> int:
    """Distinct cores among ``cpus``: a core's hyperthreads share its arithmetic units."""
    cores = set()
    for cpu in cpus:
        siblings = sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        cores.add(siblings.read_text().strip() if siblings.exists() else str(cpu))
    return max(len(cores), 1)


def cgroup_quota(root: Path, self_cgroup: Path) -> Optional[float]:
    """The tightest CPU quota on this process's cgroup and its ancestors, in cores (v2 or v1)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: List[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (root / "cgroup.controllers").exists():  # v2
            quotas += [q for d in _levels(root, path) if (q := _v2_quota(d / "cpu.max")) is not None]
        elif "cpu" in controllers.split(","):  # v1: mounted as cpu, or cpu,cpuacct
            mounts = [root / name for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu") if (root / name).is_dir()]
            quotas += [q for d in _levels(mounts[0], path) if (q := _v1_quota(d))] if mounts else []
    return min(quotas) if quotas else None


def _levels(mount: Path, path: str) -> Iterator[Path]:
    """The cgroup's folder and its ancestors up to the mount (a container sees its own at the mount)."""
    here = mount / path.lstrip("/")
    while here != mount and here.is_relative_to(mount):
        if here.is_dir():
            yield here
        here = here.parent
    yield mount


def _v2_quota(cpu_max: Path) -> Optional[float]:
    try:
        quota, period = cpu_max.read_text().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(folder: Path) -> Optional[float]:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 else None


# ----------------------------------------------------------------------------- runs and CPU time


def _stat_fields(pid: int, proc: Path) -> Optional[List[str]]:
    """/proc/<pid>/stat from its third field on (the command name may hold spaces and parentheses)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def process_seconds(pid: int, proc: Path = PROC) -> Optional[float]:
    fields = _stat_fields(pid, proc)
    return (int(fields[11]) + int(fields[12])) / TICK if fields else None  # utime + stime


def _started(pid: int, proc: Path) -> Optional[str]:
    fields = _stat_fields(pid, proc)
    return fields[19] if fields else None  # ticks after boot: with the pid, names the process


@dataclass
class Registry:
    """The runs of this framework alive on this machine: one file per process, named by its pid and
    holding its start time (so that a reused pid is not counted)."""

    folder: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / f"nli-runs-{os.getuid()}")
    proc: Path = PROC

    def join(self) -> None:
        started = _started(os.getpid(), self.proc)
        if started is None:  # no /proc: nothing to count by
            return
        try:
            self.folder.mkdir(mode=0o700, exist_ok=True)
            (self.folder / str(os.getpid())).write_text(started)
        except OSError as e:  # a read-only temporary directory: the run counts only itself
            log.debug("cannot join the registry of runs in %s: %s", self.folder, e)

    def leave(self) -> None:
        (self.folder / str(os.getpid())).unlink(missing_ok=True)

    def others(self) -> List[int]:
        """The pids of the other live runs; files of ended runs are removed on the way."""
        alive = []
        for entry in self.folder.glob("[0-9]*") if self.folder.is_dir() else []:
            pid = int(entry.name)
            if pid == os.getpid():
                continue
            try:
                recorded = entry.read_text()
            except OSError:
                continue
            if _started(pid, self.proc) == recorded:
                alive.append(pid)
            else:
                entry.unlink(missing_ok=True)
        return alive


@dataclass(frozen=True)
class Sample:
    """CPU time so far: of the cores this process may use, of this process, of the other runs."""

    when: float
    busy: float  # seconds those cores spent busy, all processes
    own: float
    runs: Dict[int, float]  # other run's pid -> its CPU seconds


def take_sample(cpus: Set[int], runs: List[int], proc: Path = PROC) -> Optional[Sample]:
    try:
        lines = (proc / "stat").read_text().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        name, *ticks = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            user, nice, system, _idle, _iowait, irq, softirq = (int(t) for t in ticks[:7])
            busy += user + nice + system + irq + softirq  # steal is not ours to count: the host's other guests
    times = os.times()
    seconds = {pid: s for pid in runs if (s := process_seconds(pid, proc)) is not None}
    return Sample(monotonic(), busy / TICK, times.user + times.system, seconds)


def foreign_load(before: Sample, after: Sample) -> float:
    """Cores' worth of CPU that processes other than this run and its fellow runs kept busy between
    two samples."""
    elapsed = after.when - before.when
    if elapsed <= 0:
        return 0.0
    runs = sum(after.runs[pid] - before.runs[pid] for pid in after.runs if pid in before.runs)
    return max(0.0, (after.busy - before.busy) - (after.own - before.own) - runs) / elapsed


# ------------------------------------------------------------------------------------ the policy


def share(usable: float, runs: int, foreign: float) -> int:
    """Threads for one of ``runs`` runs on ``usable`` cores of which ``foreign`` are kept busy by other
    processes: its equal part of the cores (rounded down: a fraction of a core is not a thread), and
    no more than its part of the free ones (rounded), at least one."""
    equal = math.floor(usable / runs + 1e-9)
    free = math.ceil(max(usable - foreign, 0.0) / runs - 0.5)  # half a free core is not one
    return max(1, min(equal, free))


def fixed_threads(configured: Optional[int], env: Mapping[str, str]) -> Optional[str]:
    """Why the thread count is not this module's to choose, or None."""
    if configured is not None:
        return f"hw.cpu_threads={configured}"
    if env.get("OMP_NUM_THREADS"):
        return f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']} in the environment"
    return None


class Threads:
    """The run's thread count: chosen at :meth:`decide`, looked at again by :meth:`revisit` (called
    after every training step)."""

    def __init__(self, registry: Registry, cores: Cores, local_processes: int,
                 set_threads: Callable[[int], None]) -> None:
        self.registry, self.cores, self.local_processes = registry, cores, local_processes
        self.set_threads = set_threads
        self.threads = 0
        self.runs, self.foreign = 1, 0.0  # what the last look saw
        self.last = take_sample(cores.cpus, registry.others(), registry.proc)

    def decide(self) -> int:
        """The count from what the machine did since the last look; set, and logged when it changes."""
        others = self.registry.others()
        now = take_sample(self.cores.cpus, others, self.registry.proc)
        foreign = foreign_load(self.last, now) if self.last and now else 0.0
        runs = max(len(others) + 1, self.local_processes)
        threads = share(self.cores.usable, runs, foreign)
        self.last, self.runs, self.foreign = now, runs, foreign
        if threads != self.threads:
            self.set_threads(threads)
            verb = "threads" if self.threads == 0 else f"threads {self.threads} ->"
            log.info("%s %d: %s, %d run(s) of this machine sharing them, %.1f core(s) busy with other "
                     "processes (hw.cpu_threads fixes the count)", verb, threads, self.cores.describe(), runs, foreign)
            self.threads = threads
        return threads

    def revisit(self) -> None:
        """Decide again if the last look is more than a few seconds old: cheap enough for every step."""
        if self.last is not None and monotonic() - self.last.when >= REVISIT_SECONDS:  # None: no /proc to read
            self.decide()


def _set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


class Sharing:
    """This run's part of the machine's CPU, from start (before torch loads: the registry joined, the
    first sample taken) to its end. :meth:`start` sets the threads once torch has loaded;
    :meth:`revisit` looks again during training."""

    def __init__(self, configured: Optional[int], local_processes: int, env: Mapping[str, str] = os.environ) -> None:
        self.configured, self.local_processes = configured, local_processes
        self.fixed = fixed_threads(configured, env)
        self.registry = Registry()
        self.threads: Optional[Threads] = None

    def __enter__(self) -> Sharing:
        self.registry.join()
        if self.fixed is None:
            self.threads = Threads(self.registry, find_cores(), self.local_processes, _set_torch_threads)
        return self

    def __exit__(self, *_: object) -> None:
        self.registry.leave()

    def start(self) -> int:
        import torch

        if self.threads is not None:
            threads = self.threads.decide()
        else:
            if self.configured is not None:
                torch.set_num_threads(self.configured)
            threads = torch.get_num_threads()
            log.info("threads %d: %s", threads, self.fixed)
        try:  # the inter-op pool (not used by training; started lazily) sized alike
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # set before this run began (a second run in one process): left as it is
            pass
        return threads

    def revisit(self) -> None:
        if self.threads is not None:
            self.threads.revisit()

    def hold(self, why: str) -> None:
        """The count chosen so far stays for the rest of the run, ``why`` logged: :meth:`revisit` does nothing."""
        if self.threads is not None:
            log.info("threads %d from here on: %s", self.threads.threads, why)
            self.threads = None


# ------------------------------------------------------------------------------------------ heap


def limit_heap(threshold: Optional[int], env: Mapping[str, str]) -> Optional[str]:
    """glibc's mmap threshold fixed at ``threshold`` bytes: blocks above it are mapped and returned
    whole. glibc otherwise raises the threshold each time a large block is freed, and the packed CPU
    layers' blocks (of a different size every batch) then fragment the heap: 3.1 GiB peak over three
    epochs against 1.7, at 14% less speed on MiniLM (benchmarks/RESULTS.md), so opt-in. None where
    glibc is not the allocator, the config says null, or ``MALLOC_MMAP_THRESHOLD_`` already set it;
    else what was done, for the log."""
    if threshold is None or "MALLOC_MMAP_THRESHOLD_" in env:
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, macOS)
        return None
    if not libc.mallopt(M_MMAP_THRESHOLD, threshold):
        log.warning("glibc refused hw.cpu_mmap_threshold=%d; its own adaptive threshold stays", threshold)
        return None
    return f"glibc's mmap threshold fixed at {threshold} bytes (hw.cpu_mmap_threshold)"
