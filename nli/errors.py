"""The errors a user can fix. Each message names what is wrong and how to fix it; the entry point
(nli.cli) ends the run with the message alone, no traceback, and nothing already saved is lost.

Light on purpose: the config schema raises these before torch loads.
"""

from __future__ import annotations

from hydra.errors import CompactHydraException


class UserError(Exception):
    """Something in what the user asked for or gave the run, not a fault of the code."""


class ConfigError(UserError, ValueError):
    """A config value that cannot work; the message names the key and the fix."""


class DataError(UserError, ValueError):
    """Data that cannot be used as it is; the message names the file (and line) and what to change."""


class HubUnavailableError(UserError):
    """Something had to come from the Hugging Face Hub and could not."""


class CheckpointError(UserError):
    """No usable checkpoint, or one that belongs to another run; the message says what to do."""


class StorageError(UserError, OSError):
    """The output directory cannot be written or read; the message says where and why."""


class Diverged(UserError):
    """The training loss became NaN or infinite more often than train.skip_nonfinite allows."""

    def __init__(self, message: str, *, step: int, loss: float) -> None:
        super().__init__(message)
        self.step, self.loss = step, loss


class OutOfMemory(UserError):
    """The device ran out of memory where a smaller batch cannot help, or cannot be agreed on (nli.evaluate.oom)."""


class RunChanged(UserError):
    """The output folder holds a run with other settings; the message lists each change and the ways on."""


def google_client_missing(error: ImportError) -> bool:
    """Whether ``error`` is Google's client libraries missing or broken (the ``vertex`` extra), the one import
    failure that installing the extra fixes: any other (a module of ours, another library) surfaces as it is."""
    return (error.name or "").split(".")[0] == "google"


class JobFailed(CompactHydraException):
    """A user error in one job of a sweep. An exception, not an exit: Hydra's launchers record the job
    as failed and run the others, and Hydra prints it without a traceback."""
