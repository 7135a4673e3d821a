"""The sweeper Hydra discovers: Hydra accepts plugins only from the ``hydra_plugins`` package and executes
every public module of it at start-up, so this one stays light and loads the search (and Optuna) when a
sweep starts."""

from __future__ import annotations

from typing import Any, List, Optional

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class OptunaSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings  # conf/hydra/sweeper/optuna.yaml's keys, the sampler's and pruner's as configs
        self.search: Optional[Any] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from nli.errors import ConfigError
        from nli.sweep.search import OptunaSearch, Settings, made

        settings = dict(self.settings)
        try:
            sampler, pruner = made(settings.pop("sampler"), "sampler"), made(settings.pop("pruner", None), "pruner")
            self.search = OptunaSearch(sampler, Settings.of(settings), pruner)
            self.search.setup(hydra_context=hydra_context, task_function=task_function, config=config)
        except ConfigError as error:  # as the app's refusals end: one line, status 1, no traceback
            raise SystemExit(f"error: {error}") from None

    def sweep(self, arguments: List[str]) -> None:
        from nli.errors import ConfigError

        assert self.search is not None, "setup() runs first"
        try:
            self.search.sweep(arguments)
        except ConfigError as error:  # the study's storage or direction, refused before any trial
            raise SystemExit(f"error: {error}") from None
