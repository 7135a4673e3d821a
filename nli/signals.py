"""SIGTERM and SIGINT as a request to stop at the next step boundary.

Vertex AI sends SIGTERM before it reclaims a spot VM, Slurm before a time limit, and Ctrl-C
sends SIGINT. Instead of dying mid-step, the run finishes the step, writes a checkpoint and
exits; started again, it continues from there. A second Ctrl-C stops at once.

A platform that requeues a job on a signal of its own (submitit on Slurm: USR2, before a time
limit or a preemption) names it (nli.platform); that signal stops the run the same way, and once
the checkpoint is written `hand_over()` passes it on to the platform's own handler, so the
requeued job continues from this very step.

Light on purpose (no torch): the entry point catches :class:`Preempted` before torch loads.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any, Dict, Optional

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
    """A signal asked the run to stop; a checkpoint of ``step`` has been written."""

    def __init__(self, step: int, signal: str) -> None:
        super().__init__(f"{signal} at step {step}")
        self.step, self.signal = step, signal


class StopRequest:
    """While active (``with StopRequest(requeue=...) as stop:``), ``stop.signal`` names the signal
    that asked the run to stop, or is None."""

    def __init__(self, *, requeue: Optional[signal.Signals] = None) -> None:
        self.signal: Optional[str] = None
        self._requeue = requeue
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            signals = (*SIGNALS, self._requeue) if self._requeue else SIGNALS
            self._previous = {s: signal.signal(s, self._handle) for s in signals}
        return self

    def hand_over(self) -> None:
        """After the stop's checkpoint: if the platform's requeue signal asked for the stop, run the
        platform's own handler, which requeues the job and ends this process."""
        handler = self._previous.get(self._requeue) if self._requeue else None
        if self._requeue and self.signal == self._requeue.name and callable(handler):
            log.warning("handing %s over to the platform, which requeues the job", self.signal)
            handler(self._requeue, None)

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # pressed twice: stop now
        self.signal = name
        log.warning("%s received: stopping after this step, with a checkpoint", name)
