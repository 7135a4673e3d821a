"""The launcher Hydra discovers. Plugin discovery executes every module of ``hydra_plugins`` whose name
has no leading underscore (again, if it was already imported), so only this one and ``config`` are
public and both stay light: the Vertex AI client and the rest load from ``_core`` at launch."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence, cast

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from .config import VertexLauncherConf


class VertexLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        merged = OmegaConf.merge(OmegaConf.structured(VertexLauncherConf), params)
        self.settings = cast(VertexLauncherConf, OmegaConf.to_object(merged))
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.sweep: Any = None  # _core.Sweep, made at the first launch and kept across batches
        self._making = threading.Lock()

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        # The task function is not used: each job runs the app's own entry point on Vertex AI.
        from ._checks import check_settings

        with _refusals():
            check_settings(self.settings)  # before Hydra saves the sweep's config, so no secret lands there
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from nli.errors import google_client_missing

        from ._checks import LaunchError

        with _refusals():
            try:
                from ._core import Sweep
            except ImportError as error:
                if not google_client_missing(error):
                    raise
                raise LaunchError(f"hydra/launcher=vertex needs Google's Vertex AI client ({error}): "
                                  "pip install 'nli-glue[vertex]' (or -e '.[vertex]' in a checkout)") from None

            return self._sweep(Sweep).launch(job_overrides, initial_job_idx)

    def run_folder(self, overrides: Sequence[str], num: int) -> str:
        """Where job ``num`` of the sweep writes (its model directory in the bucket): the Optuna sweeper reads
        a trial's evaluations there (nli.sweep.pruning)."""
        from ._core import Sweep

        return str(self._sweep(Sweep).model_dir(num))

    def _sweep(self, make: Any) -> Any:
        assert self.config is not None and self.hydra_context is not None, "setup() comes first"
        with self._making:  # the Optuna sweeper launches each trial from a thread of its own (nli.sweep.slots)
            if self.sweep is None:
                self.sweep = make(self.settings, self.config, self.hydra_context)
            return self.sweep


@contextmanager
def _refusals() -> Iterator[None]:
    """The launcher's refusals as the app's end: ``error: <what to change>`` on stderr, exit status 1."""
    from ._checks import LaunchError, Refused

    try:
        yield
    except LaunchError as error:
        raise Refused(error) from None
