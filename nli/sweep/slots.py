"""A search's trials in flight: up to ``n_jobs`` at once through the sweep's Hydra launcher, and the next
asked for as soon as one ends.

Hydra's ``Launcher.launch`` takes a batch and returns when its whole batch has ended: a sweeper that hands it
``n_jobs`` trials leaves the slots of those that end first idle until the slowest ends. Its interface has no
call that returns as each job ends, so the least that works is one ``launch`` per trial, each in a thread of
the sweep's process, for the launchers whose jobs run outside this process and which several launches at a
time do not disturb (:data:`APART`): joblib's (``hydra/launcher=local-gpus``), submitit's (local and Slurm)
and the project's Vertex AI launcher. Hydra's basic launcher runs each job in this process (it changes the
working directory, and a run sets its signal handlers, which only the main thread may), so it runs one trial
at a time, the sampler seeing each result before it draws again, and so does joblib's with ``n_jobs=1`` (its
sequential backend runs the job in the calling thread: ``local-gpus`` on a machine with no GPU, or one). No
more trials run at once than joblib's ``n_jobs``. Any other launcher gets batches, as Hydra's own sweepers give
it.

Ctrl-C reaches the main thread alone: it is passed on to every launch in flight, so that each ends as it
would in the main thread (joblib stops its workers, the Vertex launcher cancels its jobs; submitit's launcher
cancels none, so its jobs are cancelled here), and the trials stay RUNNING in the study for the same command to
resume (nli.sweep.search). SIGTERM to the sweep's process alone is passed on to the runs of the trials in flight
on this machine, which a signal to that process does not reach, before the sweep ends.

Light on purpose (no torch): the sweep's own process runs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Dict, Iterator, List, Mapping, Optional, Set

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher

from nli.contract import CLAIM_FILE
from nli.io.claim import HOST, Owner

log = logging.getLogger(__name__)

# Launchers (by class, or a base class) whose jobs run in other processes or machines, and whose launch() may be
# called from several threads at once: each call builds its own executor (joblib, submitit), or composes under a
# lock and watches its own jobs (the Vertex launcher).
APART = frozenset({
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.BaseSubmititLauncher",
    "hydra_plugins.vertex_launcher.vertex_launcher.VertexLauncher",
})
BASIC = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
SUBMITIT = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.BaseSubmititLauncher"
_LOOK = 0.5  # seconds between the main thread's looks for an ended trial (it must stay free to take Ctrl-C)


def _names(launcher: Launcher) -> Set[str]:
    return {f"{each.__module__}.{each.__qualname__}" for each in type(launcher).__mro__}


def joblib_width(launcher: Launcher) -> Optional[int]:
    """The jobs a joblib launcher runs at once, its ``n_jobs`` as joblib reads it (-1: every core); None for
    another launcher, or one not yet given its settings."""
    settings = getattr(launcher, "joblib", None)
    if JOBLIB not in _names(launcher) or not isinstance(settings, Mapping) or "n_jobs" not in settings:
        return None
    import joblib  # type: ignore[import-untyped]  # the joblib launcher's dependency (no types), there with it

    n_jobs = settings["n_jobs"]
    return int(joblib.effective_n_jobs(None if n_jobs is None else int(n_jobs)))


def kind(launcher: Launcher) -> str:
    """``apart`` (a trial per launch, several at once), ``basic`` (one at a time) or ``batched``. Joblib with
    one job at a time runs it in the calling thread (its sequential backend, as on a machine without GPUs under
    ``local-gpus``), where several launches at once would run side by side in this process, as basic's would."""
    names = _names(launcher)
    if names & APART:
        return "basic" if joblib_width(launcher) == 1 else "apart"
    return "basic" if BASIC in names else "batched"


@dataclass
class Launched:
    """A trial's job: its number in this command's table, its overrides, the folder it writes (its results, and
    the evaluations the pruner reads), and once it ends, Hydra's return for it."""

    trial: Any  # optuna.Trial
    num: int
    overrides: List[str]
    folder: Optional[str] = None
    result: Optional[JobReturn] = None
    error: Optional[BaseException] = field(default=None, repr=False)  # launch() itself raised


def _consecutive(batch: List[Launched]) -> List[List[Launched]]:
    """A batch in runs of consecutive job numbers (a trial resuming a stopped one takes that one's number)."""
    runs: List[List[Launched]] = []
    for job in batch:
        if runs and runs[-1][-1].num + 1 == job.num:
            runs[-1].append(job)
        else:
            runs.append([job])
    return runs


class Slots:
    """Starts trials' jobs through ``launcher``, at most ``width`` at once, and hands each back as it ends;
    not ``asynchronous``: in batches of ``width``, each launched whole, as Hydra's own sweepers do."""

    def __init__(self, launcher: Launcher, width: int, *, asynchronous: bool = True) -> None:
        self.launcher, self.kind = launcher, kind(launcher) if asynchronous else "batched"
        self.asked, self.cap = width, joblib_width(launcher)
        # More trials at once than joblib runs would only queue in its workers (under local-gpus, past the slots).
        self.width = 1 if self.kind == "basic" else min(width, self.cap or width)
        self.waiting: List[Launched] = []  # batched: the batch to launch at the next wait()
        self.running: Dict[int, threading.Thread] = {}  # apart: trial's job number -> the thread that launched it
        self.jobs: Dict[int, Launched] = {}  # apart: the jobs of those threads
        self.ended: "queue.Queue[Launched]" = queue.Queue()

    def describe(self) -> str:
        """How the trials run, said once as the search starts; why fewer at once than hydra.sweeper.n_jobs."""
        if self.kind == "basic":
            runner = ("hydra.launcher.n_jobs=1: joblib" if self.cap == 1 else "Hydra's basic launcher")
            return f"one at a time ({runner} runs each in this process)"
        capped = f" (hydra.launcher.n_jobs={self.cap})" if self.width < self.asked else ""
        if self.kind == "apart":
            return f"up to {self.width} at a time{capped}, the next as soon as one ends"
        why = ("hydra.sweeper.asynchronous=false" if kind(self.launcher) != "batched" else
               f"{type(self.launcher).__name__} may not take several launches at once")
        return f"in batches of {self.width}{capped} ({why}: each batch waits for its slowest trial)"

    @property
    def busy(self) -> int:
        return len(self.waiting) + len(self.running)

    def free(self) -> bool:
        return self.busy < self.width

    def start(self, job: Launched) -> None:
        if self.kind != "apart":
            self.waiting.append(job)
            return
        thread = threading.Thread(target=self._launch, args=(job,), name=f"trial-{job.num}", daemon=True)
        self.running[job.num], self.jobs[job.num] = thread, job
        thread.start()

    def wait(self) -> List[Launched]:
        """The jobs that have ended: at least one (a batch's whole batch), blocking until then."""
        if self.waiting:
            batch, self.waiting = self.waiting, []
            for run in _consecutive(batch):  # Hydra numbers a launch's jobs on from its first
                returns = self.launcher.launch([job.overrides for job in run], initial_job_idx=run[0].num)
                for job, result in zip(run, returns):
                    job.result = result
            return batch
        try:
            with self._sigterm_passed_on():
                ended = [self._next()]
            while not self.ended.empty():
                ended.append(self.ended.get_nowait())
        except KeyboardInterrupt:
            self.interrupt()
            raise
        for job in ended:
            self.running.pop(job.num).join()
            self.jobs.pop(job.num, None)
        return ended

    @contextlib.contextmanager
    def _sigterm_passed_on(self) -> Iterator[None]:
        """While the trials run, SIGTERM to the sweep is passed on to their runs on this machine first (joblib's
        workers, submitit's local jobs: processes of their own, which a SIGTERM to the sweep's process alone does
        not reach), each found by the claim it holds on its folder; then the sweep's own handler ends it at once.
        Each run stops as a run stops at SIGTERM, its checkpoint written, for the same command to resume. Else the
        sweep ended and its trials trained on to their ends, with no sweep to tell the study, and the same command
        again found their folders held by runs still going. The sweep does not wait for them: the first run to
        end would have joblib end the others' processes, mid-checkpoint."""
        before = signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is not threading.main_thread() or not callable(before):
            yield
            return

        def stop(signum: int, frame: Optional[FrameType]) -> None:
            signal.signal(signal.SIGTERM, before)  # a second SIGTERM ends the sweep at once
            self._stop_runs(signal.SIGTERM)
            before(signum, frame)

        signal.signal(signal.SIGTERM, stop)
        try:
            yield
        finally:
            if signal.getsignal(signal.SIGTERM) is stop:
                signal.signal(signal.SIGTERM, before)

    def _stop_runs(self, signum: int) -> None:
        """Passes ``signum`` to the run of each trial in flight that runs on this machine."""
        stopped = [(job, pid) for job in list(self.jobs.values()) if (pid := _run_pid(job.folder)) is not None]
        for job, pid in stopped:
            log.info("%s: passed on to trial %d's run (job %d, pid %d), which stops with a checkpoint",
                     signal.Signals(signum).name, job.trial.number, job.num, pid)
            with contextlib.suppress(OSError):  # ended meanwhile
                os.kill(pid, signum)

    def _next(self) -> Launched:
        while True:
            try:
                return self.ended.get(timeout=_LOOK)
            except queue.Empty:
                continue

    def _launch(self, job: Launched) -> None:
        try:
            job.result = self.launcher.launch([job.overrides], initial_job_idx=job.num)[0]
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which decides
            job.error = error
        self.ended.put(job)

    def interrupt(self, wait: float = 60.0) -> None:
        """Ctrl-C, passed on to each launch in flight (as if it ran in the main thread), and a wait for them
        to end (cancelled jobs, stopped workers) of at most ``wait`` seconds."""
        threads = list(self.running.values())
        for thread in threads:
            if thread.ident is not None and thread.is_alive():
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                           ctypes.py_object(KeyboardInterrupt))
        for thread in threads:
            thread.join(timeout=wait / max(1, len(threads)))
        if SUBMITIT in _names(self.launcher):
            while not self.ended.empty():
                stopped = self.ended.get_nowait().error
                if isinstance(stopped, KeyboardInterrupt):
                    _cancel_submitted(stopped)


def _run_pid(folder: Optional[str]) -> Optional[int]:
    """The process of the run that holds ``folder`` (its claim, nli.io.claim), where it runs on this machine."""
    if folder is None or "://" in folder:
        return None
    try:
        owner = Owner.decode((Path(folder) / CLAIM_FILE).read_bytes())
    except OSError:  # not claimed yet, or ended
        return None
    if owner is None or owner.host != HOST or owner.pid == os.getpid():
        return None
    return owner.pid


def _cancel_submitted(stopped: KeyboardInterrupt) -> None:
    """Cancels the submitit jobs of a launch Ctrl-C stopped. Hydra's submitit launcher returns no job until all
    have ended and cancels none as it is interrupted: its jobs (local processes of their own, Slurm's) would
    train on. It holds them in its launch's frame alone, which the interrupt's traceback keeps."""
    import submitit  # the launcher's dependency, there with it

    jobs: Dict[str, Any] = {}  # by id: submitit's own frames hold each job too
    frame = stopped.__traceback__
    while frame is not None:
        for held in frame.tb_frame.f_locals.values():
            jobs.update((job.job_id, job) for job in (held if isinstance(held, list) else [held])
                        if isinstance(job, submitit.Job))
        frame = frame.tb_next
    for job_id, job in jobs.items():
        log.info("Ctrl-C: cancelling submitit job %s", job_id)
        job.cancel(check=False)
