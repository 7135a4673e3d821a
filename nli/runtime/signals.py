"""SIGTERM and SIGINT honoured in every phase of a run.

Vertex AI sends SIGTERM before it reclaims a spot VM, Slurm before a time limit, and Ctrl-C sends
SIGINT. While training steps run, the signal is a request to stop at the next step boundary: the
run finishes the step, writes a checkpoint and exits (:class:`Preempted`); started again, it
continues from there. In every other phase (start-up, data loading, the final evaluation, export
and predictions) nothing is half-way that a checkpoint could keep, so the run stops at once
(:class:`Interrupted`), and the entry point says what was saved. A second signal always stops at once, but
the same signal again within :data:`ECHO_SECONDS` is the first one's copy: under torchrun on Slurm each rank gets
Slurm's signal and torchrun's forwarded one, milliseconds apart.

Once a signal has stopped the run, the process ends within seconds (:func:`end_promptly`): a further signal
ends it at once, with the same status, and so does a watchdog where a thread would hold it at exit.

A platform that requeues a job on a signal of its own (submitit on Slurm: USR2, before a time
limit or a preemption) names it (nli.runtime.platform); that signal stops the run the same way, and once
the run has stopped `hand_over()` passes it on to the platform's own handler, so the requeued job
continues from the last checkpoint.

Where nothing can stop at once without harm (a sweep's own process between the jobs it runs itself: Hydra composes
the next job's config, Optuna writes its study), a Ctrl-C is held (:func:`hold_ctrl_c`): noted, and acted on where
the process can stop cleanly: the next job's start, a run's StopRequest, the command's end.

Only a process's main thread receives signals. Where the run is in another thread (PyTorch/XLA runs
each device's run in a thread of its process: nli.runtime.xla), :func:`relay_to_threads` has the main thread
note the signal for the run's StopRequest, which stops at the next step boundary or phase check; a
second signal ends the process at once.

Light on purpose (no torch): the entry point catches these before torch loads.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional

from nli.contract import PREEMPTED

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)

# What a run stopped at once had saved, by how far it had come (Interrupted.stage).
INTERRUPTED = {
    "starting": "before training began: nothing new was saved (checkpoints already in the output folder are as "
                "they were). Run the same command again to start",
    "training": "at once (a second signal), in the middle of a step: that step was not saved. Run the same command "
                "again to continue from the last checkpoint",
    "evaluating": "during an evaluation-only run, before its results: nothing was lost (what it wrote so far, the "
                  "same command writes again in its place). Run the same command again to evaluate",
    "finishing": "after training, before its results were written: training is complete and checkpointed. Run the "
                 "same command again to export the best model and write the results",
}


ECHO_SECONDS = 1.0  # the same signal again within this is the first one's copy, not a second signal


class Preempted(Exception):
    """A signal asked the run to stop; a checkpoint of ``step`` has been written."""

    def __init__(self, step: int, signal: str) -> None:
        super().__init__(f"{signal} at step {step}")
        self.step, self.signal = step, signal


class Interrupted(BaseException):
    """A signal stopped the run at once, outside the training steps (or a second signal inside them).
    A BaseException, as KeyboardInterrupt is: raised from the signal handler wherever the run is, it
    passes through the libraries' ``except Exception``. A bare ``except:`` still swallows it (datasets'
    fingerprinting has one): :meth:`StopRequest.check` at each phase boundary raises it again."""

    def __init__(self, signal: str, *, second: bool = False) -> None:
        super().__init__(signal)
        self.signal = signal
        self.stage = "starting"  # how far the run had come: starting, evaluating, training, finishing (the recipe)
        self.second = second  # a second signal: inside the training steps, the only one that stops them at once


def interruption(error: BaseException) -> Optional[Interrupted]:
    """The :class:`Interrupted` that caused ``error``, if one did. Python 3.11 turns an exception raised while
    it runs a hook of its own into another one: a signal that lands in a class's ``__set_name__`` while a
    library imports (pandas' dataclasses, say) becomes "RuntimeError: Error calling __set_name__", its
    cause the Interrupted (3.12 raises the Interrupted itself), as may a library that catches and raises
    anew. The run stops as the signal asked, not as a crash."""
    seen: List[int] = []
    while error is not None and id(error) not in seen:
        if isinstance(error, Interrupted):
            return error
        seen.append(id(error))
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return None


class StopRequest:
    """While active (``with StopRequest(requeue=...) as stop:``), SIGTERM, SIGINT and the platform's
    requeue signal raise :class:`Interrupted` where the run is, except inside :meth:`at_step_boundaries`,
    where the first of them is only noted in ``stop.signal`` for the training loop to act on."""

    def __init__(self, *, requeue: Optional[signal.Signals] = None) -> None:
        self.signal: Optional[str] = None
        self._requeue = requeue
        self._previous: Dict[int, Any] = {}
        self._deferred = False
        self._since = 0.0  # when the first signal came (time.monotonic)

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            signals = (*SIGNALS, self._requeue) if self._requeue else SIGNALS
            self._previous = {s: signal.signal(s, self._handle) for s in signals}
            self.signal = take_held()  # a Ctrl-C held for the run to act on: it stops at its first check
        else:  # the main thread's relay, if installed, notes signals for it: one that came before, too
            self.signal = self.signal or _relayed
            _IN_THREADS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if self in _IN_THREADS:
            _IN_THREADS.remove(self)

    @contextmanager
    def at_step_boundaries(self) -> Iterator["StopRequest"]:
        """Inside, a first signal waits for the loop's next step boundary."""
        self._deferred = True
        try:
            yield self
        finally:
            self._deferred = False

    def check(self) -> None:
        """Outside the training steps: raise :class:`Interrupted` for a signal already received, whose
        exception library code swallowed, so that the run stops here instead of going on."""
        if self.signal is not None and not self._deferred:
            raise Interrupted(self.signal)

    def hand_over(self) -> None:
        """Once the run has stopped: if the platform's requeue signal asked for the stop, run the
        platform's own handler, which requeues the job and ends this process."""
        handler = self._previous.get(self._requeue) if self._requeue else None
        if self._requeue and self.signal == self._requeue.name and callable(handler):
            log.warning("handing %s over to the platform, which requeues the job", self.signal)
            handler(self._requeue, None)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        name = signal.Signals(signum).name
        if name == self.signal and time.monotonic() - self._since < ECHO_SECONDS:
            return  # the first signal's copy (torchrun forwards to its ranks what Slurm sent them too)
        again = self.signal is not None
        if not again:
            self._since = time.monotonic()
        self.signal = name
        if again or not self._deferred:
            raise Interrupted(name, second=again)
        log.warning("%s received: stopping after this step, with a checkpoint", name)


Handler = Callable[[int, Optional[FrameType]], Any]
_STARTING: List[Handler] = []  # the command's handler of SIGTERM and SIGINT while it starts (stop_while_starting)
_PYTHON_DEFAULT: Dict[int, Any] = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}


def stopped_starting(signum: int, frame: Optional[FrameType]) -> NoReturn:
    """The start-up handler (:func:`stop_while_starting`'s own): the line that says so on stderr, and the status that
    says "run me again". It exits rather than raising: raised into an import or Hydra's set-up, an exception can be
    caught and dropped there, or become another."""
    print(f"stopped by {signal.Signals(signum).name} {INTERRUPTED['starting']}", file=sys.stderr)
    exit_now(PREEMPTED)


def stop_while_starting(handler: Handler = stopped_starting) -> None:
    """For a command's ``__main__``, as it starts: SIGTERM and SIGINT go to ``handler`` until the run, or a sweep,
    takes them over (:func:`started`). Nothing is half-way there that a run could keep, and Python's defaults did
    harm: SIGTERM ended the process silently (status 143) while it imported, checked its command line and Hydra
    composed and set up its run; Ctrl-C's KeyboardInterrupt, raised inside Hydra's reading of a config file,
    became another error there (its ``finally`` closes a file not yet open) and a traceback."""
    if threading.current_thread() is threading.main_thread():
        _STARTING[:] = [handler]
        for each in SIGNALS:
            signal.signal(each, handler)


def started() -> None:
    """A run, or a sweep, is about to set its own handlers: the start-up one gives way to Python's defaults,
    which is what those put back when they end (a signal after a finished run is not one before it began)."""
    if threading.current_thread() is threading.main_thread() and _STARTING:
        for each in SIGNALS:
            if signal.getsignal(each) is _STARTING[0]:
                signal.signal(each, _PYTHON_DEFAULT[each])


_HELD: List[str] = []  # a Ctrl-C noted by hold_ctrl_c's handler and not yet acted on


def hold_ctrl_c(second: Callable[[], Any]) -> Any:
    """From now until SIGINT's handler is set back to what this returns: a Ctrl-C is held, not raised where it
    lands. Python raises KeyboardInterrupt at whatever line runs, and a library there can turn it into another error
    (Hydra's reading of a config file: a traceback) or drop it (a ``__del__`` or a weakref callback that it
    interrupts: "Exception ignored"; a Hydra callback's error is a warning), and the command then goes on. Held, it
    is acted on where the process can stop cleanly: :func:`take_held` says whether one came; a run's StopRequest
    takes it as its first signal. A second Ctrl-C calls ``second`` (which ends the process) at once. For the main
    thread (None elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    _HELD.clear()

    def held(signum: int, frame: Optional[FrameType]) -> None:
        if _HELD:
            second()
            return
        _HELD.append(signal.Signals(signum).name)
        log.warning("Ctrl-C: stopping where nothing is left half-done, before the next job "
                    "(Ctrl-C again stops at once)")

    return signal.signal(signal.SIGINT, held)


def take_held() -> Optional[str]:
    """The Ctrl-C :func:`hold_ctrl_c` held (SIGINT), now in the caller's hands; None if none came."""
    return _HELD.pop() if _HELD else None


WORKER_IGNORES = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)  # what a data worker leaves to the run


def shelter_worker(_worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn``. A signal meant for the run reaches its workers too where it goes to
    every process of a job (Slurm signals every process of a job step at its time limit, at a preemption and with
    ``--signal``, as submitit asks; a terminal's Ctrl-C, its process group), and a worker that SIGTERM or a
    requeue signal ends fails the run at once ("DataLoader worker is killed by signal", raised by torch in the
    main process) where the run should stop at its next step with a checkpoint. The main process ends its workers
    itself (torch tells them through their queues): here those signals are ignored, and at exit
    :func:`end_workers` ends those still alive."""
    for each in WORKER_IGNORES:
        signal.signal(each, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_IGNORES)  # held since the fork (workers_forking)


@contextmanager
def workers_forking() -> Iterator[None]:
    """Around the fork of a loader's sheltered workers: the signals they leave to the run are blocked in this
    thread, whose mask each worker inherits. Slurm signals every process of a job at once; one that reached a
    worker after its fork, before :func:`shelter_worker` (torch's own worker SIGTERM handler comes first), ended
    it, and the run failed on it. Held instead, it is discarded in the worker by shelter_worker's SIG_IGN, and
    here delivered as the block lifts. Workers started by ``spawn`` or ``forkserver`` begin from a fresh mask;
    the project's loaders fork (Linux's default)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_IGNORES)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@functools.cache
def end_workers_at_exit() -> None:
    """Registers :func:`end_workers` with atexit, once; called once torch, and with it multiprocessing, has loaded,
    so that it runs before multiprocessing's own exit handler (atexit runs the last registered first)."""
    atexit.register(end_workers)


def end_workers(grace: float = 0.2) -> None:
    """At exit: the daemonic child processes still alive (a loader that keeps its workers, an iterator that a
    traceback holds) are sent SIGTERM, as multiprocessing's exit handler would send it before it joins them, and
    those that ignore it (:func:`shelter_worker`: they hold nothing to save) SIGKILL after ``grace`` seconds, so
    that the join that follows cannot wait for good. torch's SIGCHLD handler, which raises for a worker that died
    while its loader was in use, is put back to the default first: no loader is in use now."""
    import multiprocessing

    children = [child for child in multiprocessing.active_children() if child.daemon]
    if children and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.terminate()
    deadline = time.monotonic() + grace
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join(1.0)  # reaped here, while SIGCHLD is the default's


WIND_DOWN_SECONDS = 10.0  # how long a stopped run's process may take to end: Hydra's and the loggers' last writes


def end_promptly(status: int, *, within: float = WIND_DOWN_SECONDS) -> None:
    """A process whose run a signal stopped, on its way out: it ends with ``status`` at a further signal, at once,
    and after ``within`` seconds whatever still runs. Python waits at exit for every thread that is not a daemon,
    and a library's worker that the signal left waiting (transformers loads weights in a thread pool) held a
    stopped run for good; a second Ctrl-C while it waited raised KeyboardInterrupt there: a traceback, and a
    status other than the one the message gave. For the process's own ``__main__`` alone: it ends the process."""

    def end(*_: object) -> None:
        exit_now(status)

    for s in SIGNALS:
        signal.signal(s, end)
    torch_log = logging.getLogger("torch")
    if torch_log.level == logging.NOTSET:  # a signal stopped torch's import before its last line set it
        torch_log.setLevel(logging.WARNING)  # as that line would: its exit hooks' statistics are not said at INFO
    watchdog = threading.Timer(within, end)
    watchdog.daemon = True  # it never holds the process itself
    watchdog.start()


def end_done(status: int = 0) -> NoReturn:
    """A process whose work is done (or, with ``status``, stopped: after :func:`end_promptly`) ends as Python would
    end it, without its teardown: threading's exit hooks run and the threads that are not daemons joined, every
    ``atexit`` handler run (logging's flush, the loggers' and temporary folders' clean-up), the streams flushed,
    then ``os._exit``. Python's teardown of the modules a run loads (torch, transformers, datasets) takes 1.5-2 s
    on two cores and frees nothing the system does not free at exit; and Python puts the signals' default
    handlers back as it begins, so that a further SIGTERM then ended a stopped run with 143, not its status. For
    the process's own ``__main__`` alone: it ends the process."""
    _join_threads()
    atexit._run_exitfuncs()
    exit_now(status)


def exit_now(status: int) -> NoReturn:
    """The process ends with ``status`` at once, what it wrote to stdout and stderr flushed first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say on it
            pass
    os._exit(status)


def _join_threads() -> None:
    """What Python does first at exit (threading._shutdown): the hooks of ``threading._register_atexit`` run, then
    the threads that are not daemons are joined. The hooks come first because a thread pool's idle workers
    (concurrent.futures, which inductor's compilation keeps for the process) wait for work until theirs tells
    them to end: joined before it, they held a finished ``train.compile=true`` run for good."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
        return
    for thread in threading.enumerate():  # a Python without it: at least the threads that end by themselves
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()


_IN_THREADS: List[StopRequest] = []  # the StopRequests active in threads other than the main one
_relayed: Optional[str] = None  # the signal relay_to_threads noted, for a StopRequest that starts after it


def relay_to_threads() -> None:
    """In the main thread of a process whose runs are in other threads: a first signal is noted for
    their StopRequests, and for one that starts later (they stop at the next step boundary, or the
    next phase check, with what a signal saves there); a second one ends the process at once, as it
    would a run in the main thread."""

    def relay(signum: int, frame: Optional[FrameType]) -> None:
        global _relayed
        name = signal.Signals(signum).name
        if _relayed is not None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        log.warning("%s received: stopping at the next step or phase, saving what a checkpoint can", name)
        _relayed = name
        for request in _IN_THREADS:
            request.signal = name

    for s in SIGNALS:
        signal.signal(s, relay)
