"""Where a run is: the platform seam.

Each platform a run can find itself on has a small module here that answers the same questions
from the environment it sets: where this process stands among the processes of the run (the
variables ``torch.distributed`` reads), where the run's outputs, checkpoints and logs go, and which
signal asks it to stop so that it can be requeued. The app asks :func:`detect` and never reads a
platform's variables itself; a new platform (SageMaker, a TPU VM, Kubernetes) is one more module.

Several may apply at once: ``torchrun`` inside a Vertex AI job places the processes, while Vertex
AI names the output directory. The platforms are asked in the order of ``PLATFORMS``, the first
answer wins, and the local machine, which answers nothing, comes last.

Light on purpose (no torch): the config and the launcher import it while Hydra starts.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Protocol, Tuple

from nli.runtime.platform import local, submitit, torchrun, vertex


class Platform(Protocol):
    name: str

    def applies(self, env: Mapping[str, str]) -> bool: ...

    def process_env(self, env: Mapping[str, str]) -> Optional[Dict[str, str]]:
        """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT of this process, or None if
        this platform does not place processes (or runs one)."""

    def output_dir(self, env: Mapping[str, str]) -> Optional[str]: ...

    def checkpoint_dir(self, env: Mapping[str, str]) -> Optional[str]: ...

    def log_dir(self, env: Mapping[str, str]) -> Optional[str]: ...

    def requeue_signal(self, env: Mapping[str, str]) -> Optional[signal.Signals]:
        """The signal after which the platform requeues the job, once the run has stopped."""


PLATFORMS: Tuple[Platform, ...] = (torchrun.TORCHRUN, vertex.VERTEX, submitit.SUBMITIT, local.LOCAL)


@dataclass(frozen=True)
class Site:
    """What the platforms this process runs on say; None where none of them says anything."""

    platforms: Tuple[str, ...]  # the names of those that apply, most specific first
    process_env: Dict[str, str]  # torch.distributed's variables; empty for a single process
    output_dir: Optional[str]  # where the run's outputs go (Vertex AI: the job's model directory)
    checkpoint_dir: Optional[str]  # where checkpoints go, when not under the output directory
    log_dir: Optional[str]  # where TensorBoard's events go
    requeue_signal: Optional[signal.Signals]  # besides SIGTERM and SIGINT, which stop a run anywhere

    @property
    def local_processes(self) -> int:
        """The processes of this run on this machine (torchrun's and submitit's local world size)."""
        return int(self.process_env.get("LOCAL_WORLD_SIZE", "1"))


def detect(env: Optional[Mapping[str, str]] = None) -> Site:
    env = os.environ if env is None else env
    present = [platform for platform in PLATFORMS if platform.applies(env)]

    def first(question: str) -> Optional[str]:
        return next((answer for p in present if (answer := getattr(p, question)(env)) is not None), None)

    process_env = next((answer for p in present if (answer := p.process_env(env)) is not None), {})
    requeue = next((found for p in present if (found := p.requeue_signal(env)) is not None), None)
    return Site(platforms=tuple(p.name for p in present), process_env=process_env,
                output_dir=first("output_dir"), checkpoint_dir=first("checkpoint_dir"), log_dir=first("log_dir"),
                requeue_signal=requeue)
