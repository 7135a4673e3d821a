"""SIGTERM and SIGINT as a request to stop at the next step boundary.

Vertex AI sends SIGTERM before it reclaims a spot VM, Slurm before a time limit, and Ctrl-C
sends SIGINT. Instead of dying mid-step, the run finishes the step, writes a checkpoint and
exits; started again, it continues from there. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any, Dict, Optional

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """While active (``with StopRequest() as stop:``), ``stop.signal`` names the signal that
    asked the run to stop, or is None."""

    def __init__(self) -> None:
        self.signal: Optional[str] = None
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # pressed twice: stop now
        self.signal = name
        log.warning("%s received: stopping after this step, with a checkpoint", name)
