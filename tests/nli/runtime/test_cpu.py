"""The CPU a run shares (nli.runtime.cpu): the thread count for given cores, quota, fellow runs and busy
processes, read from cgroup and /proc trees laid out as Linux lays them out; and end to end, the real
train.py under a one-core affinity mask and with the count fixed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from nli.runtime import cpu, platform
from tests.support.runs import FAST, ROOT, process_env, read_line


@pytest.mark.parametrize("usable, runs, foreign, threads", [
    (2, 1, 0.0, 2),  # an idle machine: every core
    (2, 1, 0.2, 2),  # a little background work does not cost a thread
    (2, 1, 0.67, 1),  # a busy loop beside two threads gets two thirds of a core: still a core's worth
    (2, 1, 1.0, 1),
    (2, 1, 0.5, 1),  # half a free core is not a thread
    (2, 2, 0.0, 1),  # two runs at once: a core each
    (2, 3, 0.0, 1),  # never none
    (2, 1, 5.0, 1),
    (1.5, 1, 0.0, 1),  # a quota of one and a half cores: one thread
    (8, 1, 1.0, 7),
    (8, 2, 0.0, 4),
    (8, 2, 1.0, 3),  # four each would put nine threads on eight cores
    (16, 4, 2.0, 3),
])
def test_a_run_takes_its_share_of_the_free_cores(usable: float, runs: int, foreign: float, threads: int) -> None:
    assert cpu.share(usable, runs, foreign) == threads


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_is_the_tightest_on_the_way_up(tmp_path: Path) -> None:
    root, self_cgroup = tmp_path / "cgroup", tmp_path / "self-cgroup"
    write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    write(root / "cpu.max", "max 100000\n")
    write(root / "system.slice" / "cpu.max", "150000 100000\n")  # docker run --cpus 1.5
    write(root / "system.slice" / "job" / "cpu.max", "max 100000\n")
    write(self_cgroup, "0::/system.slice/job\n")
    assert cpu.cgroup_quota(root, self_cgroup) == 1.5
    write(root / "system.slice" / "job" / "cpu.max", "50000 100000\n")
    assert cpu.cgroup_quota(root, self_cgroup) == 0.5
    write(self_cgroup, "0::/\n")  # a container with its own cgroup namespace sees its cgroup at the root
    assert cpu.cgroup_quota(root, self_cgroup) is None
    write(root / "cpu.max", "200000 100000\n")
    assert cpu.cgroup_quota(root, self_cgroup) == 2.0


def test_cgroup_v1_quota_from_the_cpu_controller(tmp_path: Path) -> None:
    root, self_cgroup = tmp_path / "cgroup", tmp_path / "self-cgroup"
    mount = root / "cpu,cpuacct"
    write(mount / "cpu.cfs_quota_us", "-1\n")
    write(mount / "cpu.cfs_period_us", "100000\n")
    write(self_cgroup, "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cpu.cgroup_quota(root, self_cgroup) is None  # no limit anywhere
    write(mount / "docker" / "abc" / "cpu.cfs_quota_us", "300000\n")
    write(mount / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    assert cpu.cgroup_quota(root, self_cgroup) == 3.0
    assert cpu.cgroup_quota(root, tmp_path / "no-such-file") is None  # not Linux


def test_hyperthreads_of_one_core_count_once(tmp_path: Path) -> None:
    for number, siblings in enumerate(["0,2", "1,3", "0,2", "1,3"]):
        write(tmp_path / f"cpu{number}" / "topology" / "thread_siblings_list", siblings + "\n")
    assert cpu.physical_cores({0, 1, 2, 3}, tmp_path) == 2
    assert cpu.physical_cores({0, 2}, tmp_path) == 1
    assert cpu.physical_cores({0, 1, 5}, tmp_path) == 3  # a CPU without topology counts as itself


class FakeProc:
    """/proc as Linux lays it out: the per-CPU busy and idle ticks, and each process's stat line."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ticks: Dict[int, List[int]] = {0: [0] * 10, 1: [0] * 10}
        self.processes: Dict[int, List[int]] = {}  # pid -> [utime, stime, starttime]
        self.process(os.getpid(), started=1)
        self.flush()

    def process(self, pid: int, *, started: int, seconds: float = 0.0) -> None:
        self.processes[pid] = [int(seconds * cpu.TICK), 0, started]
        self.flush()

    def busy(self, cpu_number: int, seconds: float) -> None:
        self.ticks[cpu_number][0] += int(seconds * cpu.TICK)
        self.flush()

    def flush(self) -> None:
        lines = [f"cpu {' '.join('0' for _ in range(10))}"]
        lines += [f"cpu{n} {' '.join(map(str, t))}" for n, t in self.ticks.items()]
        write(self.root / "stat", "\n".join([*lines, "intr 0", "ctxt 0"]) + "\n")
        for pid, (utime, stime, started) in self.processes.items():
            fields = ["S", *["0"] * 10, str(utime), str(stime), *["0"] * 6, str(started), "0"]
            write(self.root / str(pid) / "stat", f"{pid} (python3 (a b)) {' '.join(fields)}\n")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> List[float]:
    now = [100.0]
    monkeypatch.setattr(cpu, "monotonic", lambda: now[0])
    return now


def test_other_runs_are_counted_and_busy_processes_subtracted(tmp_path: Path, clock: List[float],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    proc = FakeProc(tmp_path / "proc")
    registry = cpu.Registry(tmp_path / "runs", proc.root)
    registry.join()
    chosen: List[int] = []
    threads = cpu.Threads(registry, cpu.Cores({0, 1}, physical=2, quota=None), 1, chosen.append)
    caplog.set_level(logging.INFO, logger="nli.runtime.cpu")

    clock[0] += 5  # the imports: nothing else ran
    assert threads.decide() == 2 and chosen == [2]
    assert "threads 2: 2 core(s) in the affinity mask, 1 run(s) of this machine sharing them, 0.0 core(s) busy " \
           "with other processes" in caplog.text

    clock[0] += 10  # a busy loop of the user's took one core (it is no run of ours)
    proc.busy(1, 10)
    assert threads.decide() == 1 and chosen == [2, 1] and "threads 2 -> 1: " in caplog.text

    clock[0] += 10  # it ended; another run started and keeps a core busy: it is a fellow run, not a foreign load
    proc.process(4242, started=77, seconds=0)
    write(registry.folder / "4242", "77")
    threads.last = cpu.take_sample({0, 1}, registry.others(), proc.root)
    proc.process(4242, started=77, seconds=10)
    proc.busy(0, 10)
    assert threads.decide() == 1 and (threads.runs, threads.foreign) == (2, 0.0)

    clock[0] += 10  # that run ended: its file names a start time that no longer matches a live process
    proc.process(4242, started=99)
    assert threads.decide() == 2 and not (registry.folder / "4242").exists()
    registry.leave()
    assert list(registry.folder.iterdir()) == []


def test_revisit_looks_again_only_every_few_seconds(tmp_path: Path, clock: List[float]) -> None:
    proc = FakeProc(tmp_path / "proc")
    chosen: List[int] = []
    threads = cpu.Threads(cpu.Registry(tmp_path / "runs", proc.root), cpu.Cores({0, 1}, 2, None), 1, chosen.append)
    clock[0] += 1
    threads.decide()
    proc.busy(0, 3)
    clock[0] += cpu.REVISIT_SECONDS / 2
    threads.revisit()  # too soon: the half window's load is not looked at yet
    assert chosen == [2]
    clock[0] += cpu.REVISIT_SECONDS / 2
    threads.revisit()
    assert chosen == [2]  # 3 s busy over 10 s is 0.3 of a core: still two threads
    proc.busy(0, 10)
    clock[0] += cpu.REVISIT_SECONDS
    threads.revisit()
    assert chosen == [2, 1]


@pytest.mark.process
def test_a_live_process_in_the_registry_is_a_run_until_it_ends(tmp_path: Path) -> None:
    """Real processes and the real /proc: a run's file counts while it lives, and goes when it ends."""
    folder = tmp_path / "runs"
    code = f"from pathlib import Path; from nli.runtime.cpu import Registry; Registry(Path({str(folder)!r})).join(); " \
           "print('joined', flush=True); input()"
    other = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert read_line(other.stdout) == "joined\n"
        registry = cpu.Registry(folder)
        assert registry.others() == [other.pid]
        write(folder / "1", "12345")  # pid 1 lives, but started at another time: a stale file
        assert registry.others() == [other.pid] and not (folder / "1").exists()
    finally:
        other.communicate("\n", timeout=60)
    assert registry.others() == []


def test_the_count_is_fixed_by_the_config_before_the_environment() -> None:
    assert cpu.fixed_threads(3, {"OMP_NUM_THREADS": "1"}) == "hw.cpu_threads=3"
    assert cpu.fixed_threads(None, {"OMP_NUM_THREADS": "4"}) == "OMP_NUM_THREADS=4 in the environment"
    assert cpu.fixed_threads(None, {"OMP_NUM_THREADS": ""}) is None
    assert cpu.fixed_threads(None, {}) is None


def test_the_heap_threshold_is_left_to_an_explicit_environment() -> None:
    assert cpu.limit_heap(None, {}) is None
    assert cpu.limit_heap(1 << 20, {"MALLOC_MMAP_THRESHOLD_": "65536"}) is None
    assert cpu.limit_heap(1 << 20, {}) == "glibc's mmap threshold fixed at 1048576 bytes (hw.cpu_mmap_threshold)"


def one_core() -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


@pytest.mark.process
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity masks")
@pytest.mark.parametrize("args, env, expected", [
    ([], {}, "threads 1: 1 core(s) in the affinity mask, "),
    ([], {"OMP_NUM_THREADS": "2"}, "threads 2: OMP_NUM_THREADS=2 in the environment"),  # the user's, kept
    (["hw.cpu_threads=2"], {"OMP_NUM_THREADS": "1"}, "threads 2: hw.cpu_threads=2"),  # the config wins
])
def test_train_py_on_one_core_reports_its_thread_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       args: List[str], env: Dict[str, str], expected: str) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS")  # the suite's own setting
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *FAST, *args, f"hydra.run.dir={run_dir}"],
                          cwd=tmp_path, capture_output=True, text=True, preexec_fn=one_core, timeout=600,
                          env=process_env(env))
    assert proc.returncode == 0, proc.stderr
    log = (run_dir / "train.log").read_text()
    assert expected in log
    assert "glibc's mmap threshold" not in log  # off by default: it costs MiniLM on RTE 14% of its speed


def test_the_processes_a_platform_places_here_share_the_cores(tmp_path: Path, clock: List[float]) -> None:
    """torchrun's ranks on this machine split its cores before they have joined the registry."""
    site = platform.detect({"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                            "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"})
    assert site.local_processes == 4 and platform.detect({}).local_processes == 1
    proc = FakeProc(tmp_path / "proc")
    chosen: List[int] = []
    threads = cpu.Threads(cpu.Registry(tmp_path / "runs", proc.root), cpu.Cores(set(range(16)), 16, None),
                          site.local_processes, chosen.append)
    clock[0] += 1
    assert threads.decide() == 4 and threads.runs == 4


def test_a_held_count_is_not_looked_at_again(tmp_path: Path, clock: List[float]) -> None:
    """train.compile=true holds the count: dynamo guards on torch's thread count, on any device, so each new one
    compiles the model again (a minute for the quickstart's model on 2 cores)."""
    proc = FakeProc(tmp_path / "proc")
    chosen: List[int] = []
    sharing = cpu.Sharing(None, 1, env={})
    sharing.threads = cpu.Threads(cpu.Registry(tmp_path / "runs", proc.root), cpu.Cores({0, 1}, 2, None), 1,
                                  chosen.append)
    clock[0] += 1
    sharing.threads.decide()
    sharing.hold("compiled")
    proc.busy(0, 10)
    clock[0] += cpu.REVISIT_SECONDS
    sharing.revisit()
    assert chosen == [2]  # not [2, 1]: the busy core is not looked at


def test_a_compiled_run_on_the_cpu_holds_its_thread_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe holds the count where it compiles, on the CPU as on a GPU, whose compiled graphs guard on the
    count too (torch.compile itself stood in for by the plain module: what is under test is the thread policy, not
    inductor's minute of compiling)."""
    import torch

    from tests.support.runs import run_app

    monkeypatch.delenv("OMP_NUM_THREADS")  # the suite fixes the count; a user's run decides it
    monkeypatch.setattr(torch, "compile", lambda module, **_: module)
    threads = torch.get_num_threads()
    try:
        proc = run_app([*FAST, "train.compile=true", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert proc.returncode == 0, proc.stderr
    assert "from here on: train.compile=true compiles the model for a thread count" in \
        (tmp_path / "train.log").read_text()


def test_a_compiled_model_is_compiled_again_at_a_new_thread_count_whatever_its_device() -> None:
    """Why a compiled run holds its count on a GPU too: dynamo's guard on torch's thread count is global state, not a
    CPU kernel's choice; with no kernel of its own (the eager backend) the module is still compiled again."""
    import torch
    from torch._dynamo.utils import counters

    threads = torch.get_num_threads()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(torch.nn.Linear(4, 4), backend="eager")
    inputs = torch.randn(2, 4)
    try:
        compiled(inputs)
        compiled(inputs)
        assert counters["stats"]["unique_graphs"] == 1
        torch.set_num_threads(threads + 1)
        compiled(inputs)
        assert counters["stats"]["unique_graphs"] == 2
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
