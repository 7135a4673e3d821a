"""nli/runtime/signals.py: a train.py process whose work is done ends without Python's teardown of the
modules it loaded (end_done); what Python does at exit that matters still happens first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader


@pytest.mark.process  # it ends the process it runs in
def test_a_process_that_is_done_joins_its_threads_runs_its_exit_handlers_and_flushes_then_ends_with_0() -> None:
    script = textwrap.dedent("""
        import atexit, sys, tempfile, threading, time
        from pathlib import Path
        from nli.runtime.signals import end_done

        folder = tempfile.TemporaryDirectory()  # removed at exit by its finalizer, an atexit handler
        Path(folder.name, "kept").write_text("x")
        print(folder.name)
        atexit.register(lambda: print("exit handler ran"))
        worker = threading.Thread(target=lambda: (time.sleep(0.3), print("worker done", flush=True)))
        worker.start()
        print("unflushed", end="")  # a buffered line, flushed on the way out
        sys.stderr.write("to stderr")
        end_done()
        print("never")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # The thread was waited for (it wrote after the main thread's buffered text), then the exit handler ran.
    assert lines[1:] == ["unflushedworker done", "exit handler ran"]
    assert proc.stderr == "to stderr"
    assert not Path(lines[0]).exists()  # the temporary folder's finalizer ran


@pytest.mark.process  # it ends the process it runs in
def test_a_done_process_is_not_held_by_a_thread_pool_left_open() -> None:
    """A thread pool's idle workers (inductor keeps one for the process after ``train.compile=true``) end when
    threading's exit hook tells them to: the process ends, as Python's own exit would end it."""
    script = textwrap.dedent("""
        import atexit
        from concurrent.futures import ThreadPoolExecutor
        from nli.runtime.signals import end_done

        pool = ThreadPoolExecutor(2)  # left open, as a library's module-level pool is
        print(pool.submit(sum, [1, 2]).result(), flush=True)
        atexit.register(lambda: print("exit handler ran"))
        end_done()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.splitlines() == ["3", "exit handler ran"], proc.stderr


class _Pids(torch.utils.data.Dataset):
    """Each item: the pid of the worker that loaded it, slowly enough that both workers serve."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        time.sleep(0.005)
        return os.getpid()


def test_a_loaders_workers_outlive_the_signals_meant_for_the_run_and_end_with_the_process() -> None:
    """Slurm signals every process of a job step (its time limit, a preemption, submitit's USR2), a terminal's
    Ctrl-C its process group: sent by another process, SIGTERM, SIGINT, USR1 and USR2 leave the workers serving
    (the run stops them itself, at its next step); at exit, end_workers ends them, though they ignore SIGTERM."""
    from nli.data.loaders import worker_init
    from nli.runtime.signals import end_workers

    loader = DataLoader(_Pids(), batch_size=4, num_workers=2, worker_init_fn=worker_init(2), persistent_workers=True)
    batches = iter(loader)
    pids = {pid for _ in range(2) for pid in next(batches).tolist()}
    assert len(pids) == 2
    for name in ("TERM", "INT", "USR1", "USR2"):
        subprocess.run(["kill", f"-{name}", *map(str, pids)], check=True)
    assert len(list(batches)) == 16 - 2  # every batch still came
    sigchld = signal.getsignal(signal.SIGCHLD)  # torch's, which end_workers puts back to the default
    try:
        end_workers()
    finally:
        signal.signal(signal.SIGCHLD, sigchld)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # ended, and reaped


def test_a_signal_that_reaches_a_worker_before_its_init_leaves_it_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's SIGTERM to every process of the job, sent while a loader forks its workers (an evaluation's are
    forked at each one on a CPU), reached a worker between torch's own SIGTERM handler and its worker_init_fn:
    the worker died ("DataLoader worker ... exited unexpectedly") and the run with it, a traceback where a
    checkpoint was due. Here each worker is sent SIGTERM at that moment, by itself."""
    from torch.utils.data._utils import signal_handling

    from nli.data.loaders import Loader, worker_init

    torchs = signal_handling._set_worker_signal_handlers

    def then_signalled(*args: object) -> None:  # runs in the worker, after fork: torch's handler, then the signal
        torchs(*args)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(signal_handling, "_set_worker_signal_handlers", then_signalled)
    loader = Loader(_Pids(), batch_size=4, num_workers=2, worker_init_fn=worker_init(2))
    assert len({pid for batch in loader for pid in batch.tolist()}) == 2  # both workers served every batch


def test_a_held_ctrl_c_is_noted_not_raised_and_a_run_that_starts_takes_it() -> None:
    """hold_ctrl_c: the first Ctrl-C is noted where Python would raise it (wherever the process is); take_held hands
    it over once, and a StopRequest that starts takes it as its first signal; a second Ctrl-C calls ``second``."""
    from nli.runtime.signals import Interrupted, StopRequest, hold_ctrl_c, take_held

    seconds: list = []
    previous = hold_ctrl_c(lambda: seconds.append(True))
    try:
        os.kill(os.getpid(), signal.SIGINT)  # held: no KeyboardInterrupt here
        assert take_held() == "SIGINT" and take_held() is None and not seconds
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        assert seconds == [True]
        with StopRequest() as stop:  # the held one, taken by the run: it stops at its first check
            assert stop.signal == "SIGINT"
            with pytest.raises(Interrupted):
                stop.check()
        assert take_held() is None
        with StopRequest() as stop:  # none held: the run goes on
            stop.check()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
