"""SIGTERM and SIGINT in every phase of a run: before training (nothing saved, said so), during training
(a checkpoint at the next step; a second signal stops at once), after training (the run stops, its
training whole, and the same command finishes it). The real train.py, signalled in a process of its own,
started again in this one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, List, Sequence

import pytest

from nli.contract import PREEMPTED
from nli.runtime import signals
from nli.runtime.signals import Interrupted, StopRequest, interruption, relay_to_threads
from tests.support.runs import FAST, ROOT, copy_run, process_env, read_results, run_app


def start(args: List[str], run_dir: Path, *, before: Sequence[str] = ()) -> subprocess.Popen:
    """train.py ARGS in a process of its own (``before``: Python's own options, ``-c`` a program that runs it)."""
    return subprocess.Popen([sys.executable, *before, str(ROOT / "train.py"), *args, f"hydra.run.dir={run_dir}"],
                            cwd=run_dir.parent, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=process_env())


def wait_for(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never got there"
        time.sleep(0.02)


def logged(run_dir: Path, text: str) -> Callable[[], bool]:
    log = run_dir / "train.log"
    return lambda: log.exists() and text in log.read_text()


def stopped(proc: subprocess.Popen, *signals: signal.Signals) -> str:
    for sig in signals:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == PREEMPTED, err
    assert "Traceback" not in err
    return err


@pytest.mark.process
@pytest.mark.parametrize("when", ["start-up", "data loading"])
def test_before_training_a_signal_stops_the_run_at_once_and_says_nothing_was_saved(tmp_path: Path, when: str) -> None:
    run_dir = tmp_path / "run"
    # Enough examples that tokenizing them takes seconds.
    proc = start([*FAST, "data.synthetic_train_size=100000"], run_dir)
    if when == "start-up":  # the task function has begun: torch is loading
        wait_for(proc, lambda: (run_dir / "train.log").exists())
        time.sleep(0.3)
    else:
        wait_for(proc, logged(run_dir, "data: 100000 training examples"))
    err = stopped(proc, signal.SIGTERM)
    assert "stopped by SIGTERM before training began: nothing new was saved" in err
    assert not {"checkpoints", "model", "results.json"} & {p.name for p in run_dir.iterdir()}
    assert "Run the same command again to start" in (run_dir / "train.log").read_text()


# train.py with a signal (SIGTERM, SIGINT) sent to itself as one of the command's steps begins, the step's
# function named as module:function: nli.config.command:check (the command line's check, before Hydra),
# nli.cli:train (Hydra's task function, its run folder and log made, before the run's own handler),
# nli.tracking.loggers:start (the run's loggers, after its data, model and checkpoint loaded and before the
# training steps take signals over). The signal is handled before the step's first line.
SIGNALLED_AS = ("import importlib, os, runpy, signal, sys; where, sent = sys.argv[1:3]; "
                "module, name = where.split(':'); owner = importlib.import_module(module); "
                "step = getattr(owner, name); "
                "setattr(owner, name, lambda *a, **k: (os.kill(os.getpid(), signal.Signals[sent]), step(*a, **k))[1]); "
                "sys.argv = sys.argv[3:]; runpy.run_path(sys.argv[0], run_name='__main__')")
STEPS = {"check": "nli.config.command:check", "train": "nli.cli:train"}


@pytest.mark.process
@pytest.mark.parametrize("sent", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("step", ["check", "train"])
def test_a_signal_as_the_command_starts_stops_it_saying_nothing_was_saved(tmp_path: Path, step: str,
                                                                          sent: str) -> None:
    """Before the run's handler: while the command line is checked, or once Hydra has made the run's folder and
    log. Python's defaults ended the process there silently (SIGTERM: status 143), or with a traceback (Ctrl-C's
    KeyboardInterrupt in the check) or another status and message than a run's (130, "interrupted")."""
    run_dir = tmp_path / "run"
    proc = start(FAST, run_dir, before=["-c", SIGNALLED_AS, STEPS[step], sent])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED and "Traceback" not in err, err
    assert f"stopped by {sent} before training began: nothing new was saved" in err
    if step == "check":
        assert not run_dir.exists()
    else:
        assert [path.name for path in run_dir.iterdir()] == ["train.log"]
        assert "Run the same command again to start" in (run_dir / "train.log").read_text()


# train.py, or python -m nli, with a signal sent to itself as it first imports Hydra: the command's first imports.
AS_HYDRA_IMPORTS = """
import os, runpy, signal, sys
sent, command = signal.Signals[sys.argv[1]], sys.argv[2]
class Hook:
    def find_spec(self, name, path, target=None):
        if name == "hydra":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), sent)
sys.meta_path.insert(0, Hook())
sys.argv = sys.argv[2:]
if command == "-m":
    sys.argv = sys.argv[1:]
    runpy.run_module("nli", run_name="__main__", alter_sys=True)
else:
    runpy.run_path(command, run_name="__main__")
"""


@pytest.mark.process
@pytest.mark.parametrize("sent", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", ["train.py", "python -m nli"])
def test_a_signal_in_the_commands_first_imports_stops_it_in_one_line(tmp_path: Path, sent: str, command: str) -> None:
    """The start-up handler comes before the half second of imports (Hydra, the command line's check): Python's
    defaults ended the process there silently (SIGTERM: 143) or with KeyboardInterrupt's traceback."""
    entry = ["-m"] if command == "python -m nli" else [str(ROOT / "train.py")]
    proc = subprocess.run([sys.executable, "-c", AS_HYDRA_IMPORTS, sent, *entry, *FAST,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=process_env(), text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == PREEMPTED and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == f"stopped by {sent} before training began: nothing new was saved (checkpoints " \
        "already in the output folder are as they were). Run the same command again to start"
    assert not (tmp_path / "run").exists()


# train.py with SIGTERM sent to itself in the middle of torch's import, at the first import after FakeTensor's module
# has registered its exit hook (which logs its cache's statistics at INFO).
IN_TORCHS_IMPORT = """
import os, runpy, signal, sys
class Hook:
    def find_spec(self, name, path, target=None):
        if hasattr(sys.modules.get("torch._subclasses.fake_tensor"), "dump_cache_stats"):
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)
sys.meta_path.insert(0, Hook())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.process
def test_a_stop_in_the_middle_of_torchs_import_ends_with_its_message_alone(tmp_path: Path) -> None:
    """torch sets its loggers' level as its import ends: stopped before, its exit hooks logged their statistics
    ("FakeTensor cache stats") under the stop's message."""
    run_dir = tmp_path / "run"
    proc = start(FAST, run_dir, before=["-c", IN_TORCHS_IMPORT])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("stopped by SIGTERM before training began: nothing new was saved")
    assert "FakeTensor" not in out + err


def test_the_start_up_handler_gives_way_to_the_runs_and_is_not_put_back_after_it(
        tmp_path: Path, shared_run: Callable[[str, Sequence[str]], Path]) -> None:
    """The run's own handler is set over Python's default, not over the start-up one: it puts back what it found
    when it ends, and a SIGTERM after a finished run is not one "before training began"."""
    run_dir = copy_run(shared_run("fast", FAST), tmp_path / "run")
    original = signal.getsignal(signal.SIGTERM)
    signals.stop_while_starting(lambda *_: None)
    try:
        proc = run_app([*FAST, f"hydra.run.dir={run_dir}"], cwd=tmp_path)  # finished: answered from its results
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, original)


@pytest.mark.process
def test_a_signal_during_an_evaluation_only_run_stops_it_and_the_same_command_evaluates(
        tmp_path: Path, shared_run: Callable[[str, Sequence[str]], Path]) -> None:
    trained = shared_run("fast", FAST)
    run_dir = tmp_path / "evaluation"
    evaluate = ["eval.only=true", f"model.name_or_path={trained}", "task=synthetic", "data.max_seq_length=64",
                "train.progress_bar=false"]
    evaluate.append("data.synthetic_eval_size=12000")  # seconds of tokenizing and predicting to stop in
    proc = start(evaluate, run_dir)
    wait_for(proc, logged(run_dir, "no training set; eval validation=12000"))
    err = stopped(proc, signal.SIGTERM)
    assert "stopped by SIGTERM during an evaluation-only run, before its results: nothing was lost" in err
    assert not {"checkpoints", "results.json", "predictions"} & {p.name for p in run_dir.iterdir()}
    proc = run_app([*evaluate, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert read_results(run_dir)["status"] == "completed"


@pytest.mark.process
def test_an_evaluation_stopped_after_logging_its_scores_logs_them_once_to_one_wandb_run(
        tmp_path: Path, shared_run: Callable[[str, Sequence[str]], Path]) -> None:
    """Stopped after its scores went to the loggers, the same command logs them again: TensorBoard held each score
    twice at step 0 and W&B had a second run beside the first, whose scores `wandb sync` would upload alone."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.support.wandb_records import records

    trained = shared_run("fast", FAST)
    run_dir = tmp_path / "evaluation"
    evaluate = ["eval.only=true", f"model.name_or_path={trained}", "task=synthetic", "data.max_seq_length=64",
                "train.progress_bar=false", "data.synthetic_eval_size=12000", "logger=[tensorboard,wandb]",
                "logger.wandb.mode=offline"]  # 12,000 predictions written after the scores are logged: time to stop
    proc = start(evaluate, run_dir)
    wait_for(proc, logged(run_dir, "evaluation of "))
    stopped(proc, signal.SIGTERM)

    def accuracies() -> List[int]:
        events = EventAccumulator(str(run_dir / "tensorboard"))
        events.Reload()
        return [event.step for event in events.Scalars("eval/accuracy")]

    assert accuracies() == [0]  # the first attempt logged its scores before it stopped
    proc = run_app([*evaluate, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env={"WANDB_SILENT": "true"})
    assert proc.returncode == 0, proc.stderr
    assert accuracies() == [0]
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    ids = {record.run.run_id for f in files for record in records(f) if record.WhichOneof("record_type") == "run"}
    assert len(files) == 2 and len(ids) == 1, (files, ids)


@pytest.mark.process
@pytest.mark.parametrize("sent", ["SIGTERM", "SIGINT"])
def test_one_signal_as_the_loggers_start_says_nothing_was_saved_not_a_second_signals_lost_step(
        tmp_path: Path, sent: str) -> None:
    """The stage was already "training" there: one signal was told "at once (a second signal), in the middle of a
    step: that step was not saved" when no step had begun."""
    run_dir = tmp_path / "run"
    proc = start(FAST, run_dir, before=["-c", SIGNALLED_AS, "nli.tracking.loggers:start", sent])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED and "Traceback" not in err, err
    assert f"stopped by {sent} before training began: nothing new was saved" in err and "second signal" not in err
    assert not {"checkpoints", "model", "results.json"} & {p.name for p in run_dir.iterdir()}


@pytest.mark.process
def test_a_second_signal_during_training_stops_at_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start([*FAST, "train.max_steps=400", "data.synthetic_train_size=12800"], run_dir)
    wait_for(proc, logged(run_dir, "step 3: loss"))
    # Two signals (the kernel delivers pending ones lowest number first): the second does not wait for the step.
    err = stopped(proc, signal.SIGTERM, signal.SIGINT)
    assert re.search(r"stopped by SIG(TERM|INT) at once \(a second signal\), in the middle of a step: that step "
                     "was not saved", err)


@pytest.mark.process
def test_sigterm_to_every_process_of_the_run_its_data_workers_too_stops_it_with_a_checkpoint(tmp_path: Path) -> None:
    """As Slurm signals a job step at its time limit or a preemption: the run and its DataLoader workers at once.
    A worker that SIGTERM ended failed the run ("DataLoader worker is killed by signal") before its checkpoint."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *FAST, "train.max_steps=400",
                             "data.synthetic_train_size=12800", "data.num_workers=2", f"hydra.run.dir={run_dir}"],
                            cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=process_env(), start_new_session=True)  # its own group: the signal goes to it alone
    wait_for(proc, logged(run_dir, "step 6: loss"))
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == PREEMPTED and "Traceback" not in err, err
    assert re.search(r"preempted, resumable: SIGTERM at step \d+, checkpoint written", err)


@pytest.mark.process
def test_after_training_a_signal_stops_the_run_and_the_same_command_finishes_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # A large evaluation set: the final evaluation takes seconds, after the last checkpoint.
    args = [*FAST, "data.synthetic_eval_size=8000", "train.eval_every=12"]
    proc = start(args, run_dir)
    wait_for(proc, logged(run_dir, "step 12: checkpoint written"))
    err = stopped(proc, signal.SIGTERM)
    assert "stopped by SIGTERM after training, before its results were written: training is complete and " \
           "checkpointed" in err
    assert not (run_dir / "results.json").exists()
    again = run_app([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming from checkpoint" in again.stdout + again.stderr and "step 12: loss" not in again.stdout
    assert read_results(run_dir)["train_steps"] == 12


# train.py run with a thread that never ends beside it, as a library's worker left waiting by the signal (transformers
# loads weights in a thread pool): Python waits for such threads at exit, and a stopped run waited forever.
LINGERING = ("import runpy, sys, threading; threading.Thread(target=threading.Event().wait, name='worker').start(); "
             "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.mark.process
@pytest.mark.parametrize("again", [False, True], ids=["one-signal", "a-second-after-the-checkpoint"])
def test_a_stopped_run_ends_its_process_within_seconds_whatever_thread_is_left(tmp_path: Path, again: bool) -> None:
    """The run has stopped, its checkpoint written: the process ends with 75 although a thread would hold it at
    exit, within seconds, and at once at a second Ctrl-C (which Python raised as KeyboardInterrupt at exit:
    a traceback and status 1, under the message "preempted, resumable")."""
    run_dir = tmp_path / "run"
    proc = start([*FAST, "train.max_steps=400", "data.synthetic_train_size=12800"], run_dir, before=["-c", LINGERING])
    try:
        wait_for(proc, logged(run_dir, "step 3: loss"))
        proc.send_signal(signal.SIGINT)
        wait_for(proc, logged(run_dir, "preempted, resumable"))
        stopped_at = time.monotonic()
        if again:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == PREEMPTED, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "preempted, resumable: SIGINT at step" in err
    # Not a timing claim: the process ended at all (it never did), and a second signal ended it before the watchdog.
    if again:
        assert time.monotonic() - stopped_at < signals.WIND_DOWN_SECONDS


@pytest.mark.process
def test_a_further_sigterm_as_a_stopped_run_ends_keeps_its_status(tmp_path: Path) -> None:
    """A scheduler's second SIGTERM just after "preempted, resumable": Python's teardown (1.5-2 s of torch and the
    rest) began by putting the default handlers back, so the process died of the signal, 143, which a requeue on
    75 reads as a failure."""
    run_dir = tmp_path / "run"
    proc = start([*FAST, "train.max_steps=400", "data.synthetic_train_size=12800"], run_dir)
    try:
        wait_for(proc, logged(run_dir, "step 3: loss"))
        proc.send_signal(signal.SIGTERM)
        wait_for(proc, logged(run_dir, "preempted, resumable"))
        time.sleep(0.3)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == PREEMPTED and "preempted, resumable: SIGTERM at step" in err, (proc.returncode, err)


def test_a_signal_whose_exception_a_library_swallowed_stops_the_run_at_the_next_check() -> None:
    # datasets' fingerprinting hashes a transform inside a bare `except:`: the handler's Interrupted,
    # raised there, is swallowed, and before StopRequest.check the run went on as if no signal had come.
    with StopRequest() as stop:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs here, in the main thread
        except:  # noqa: E722  as the library does
            pass
        assert stop.signal == "SIGTERM"
        with pytest.raises(Interrupted):
            stop.check()
        with stop.at_step_boundaries():  # inside the training steps the loop acts on stop.signal itself
            stop.check()


class _HookOfClassCreation:
    """A descriptor whose ``__set_name__`` (which Python calls as it creates a class) is where a signal lands."""

    def __set_name__(self, owner: type, name: str) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs here


def test_a_signal_that_python_turned_into_another_error_is_still_the_signal() -> None:
    """A SIGTERM in a library's import, inside a class's __set_name__ (pandas' dataclasses): Python 3.11 reports it
    as "RuntimeError: Error calling __set_name__". Seen as a crash (exit 1, a traceback) when the signal came
    while the run imported pandas; it is the signal, and the run stops as one. Python 3.12 and later raise the
    signal's own error, the same words added as a note."""
    with StopRequest():
        with pytest.raises(BaseException) as raised:
            type("Imported", (), {"field": _HookOfClassCreation()})
    if sys.version_info < (3, 12):
        assert type(raised.value) is RuntimeError and isinstance(raised.value.__cause__, Interrupted)
    else:
        assert type(raised.value) is Interrupted
        assert any("Error calling __set_name__" in note for note in raised.value.__notes__)
    stopped = interruption(raised.value)
    assert stopped is not None and stopped.signal == "SIGTERM"
    assert interruption(RuntimeError("no signal")) is None


@pytest.fixture
def relay() -> Iterator[None]:
    """nli.runtime.signals.relay_to_threads in this process's main thread, undone afterwards."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    relay_to_threads()
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        signals._relayed = None


def in_a_thread(started: threading.Event, seen: List[str | None]) -> threading.Thread:
    """A run's StopRequest in a thread (not the main one: it sets no handler of its own), waiting for a signal."""

    def run() -> None:
        with StopRequest() as stop:
            started.set()
            deadline = time.monotonic() + 10
            while stop.signal is None and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(stop.signal)

    return threading.Thread(target=run)


def test_a_run_in_another_thread_learns_of_a_signal_from_the_main_thread(relay: None) -> None:
    """PyTorch/XLA runs each device's run in a thread of its process (nli.runtime.xla), where no signal arrives:
    the main thread's relay notes it for that run's StopRequest, which stops at its next step."""
    seen: List[str | None] = []
    started = threading.Event()
    thread = in_a_thread(started, seen)
    thread.start()
    assert started.wait(10)
    os.kill(os.getpid(), signal.SIGTERM)
    thread.join(15)
    assert seen == ["SIGTERM"]


def test_a_signal_relayed_before_the_run_starts_stops_it_when_it_does(relay: None) -> None:
    """The launcher may pass a signal on while the process is still importing, before the run's StopRequest."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)  # the handler runs in this thread at its next bytecode
    seen: List[str | None] = []
    thread = in_a_thread(threading.Event(), seen)
    thread.start()
    thread.join(15)
    assert seen == ["SIGTERM"]


def test_a_signal_stops_at_once_except_between_steps_where_the_second_does() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be set from the main thread")
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        with pytest.raises(Interrupted, match="SIGTERM"):  # start-up, data loading, export: at once
            os.kill(os.getpid(), signal.SIGTERM)
    with StopRequest() as stop:
        with stop.at_step_boundaries():
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.signal == "SIGTERM"  # noted, not fatal: the loop stops after its step
            with pytest.raises(Interrupted, match="SIGINT"):  # a second signal does not wait
                os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_same_signal_again_at_once_is_one_request_and_later_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun on Slurm, each rank gets Slurm's SIGTERM and torchrun's forwarded copy milliseconds apart:
    one request, which stops at the next step with a checkpoint. The same signal later is a second one."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be set from the main thread")
    with StopRequest() as stop:
        with stop.at_step_boundaries():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # the copy
            assert stop.signal == "SIGTERM"  # noted once, not fatal
            monkeypatch.setattr(signals, "ECHO_SECONDS", 0.0)  # as if a second had passed
            with pytest.raises(Interrupted, match="SIGTERM"):
                os.kill(os.getpid(), signal.SIGTERM)
