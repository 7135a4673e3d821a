"""Where training metrics go: nowhere but the log, Weights & Biases, or TensorBoard."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, Mapping, Protocol

from nli.config import LoggerConfig, TensorBoardConfig, WandbConfig

log = logging.getLogger(__name__)


class Tracker(Protocol):
    def log(self, metrics: Mapping[str, float], *, step: int) -> None: ...

    def finish(self, summary: Mapping[str, Any]) -> None: ...


class NullTracker:
    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        pass

    def finish(self, summary: Mapping[str, Any]) -> None:
        pass


class WandbTracker:
    def __init__(self, cfg: WandbConfig, *, run_name: str, group: str | None, config: Dict[str, Any],
                 output_dir: Path) -> None:
        import wandb  # deferred: slow to import, and only needed with logger=wandb

        self._run = wandb.init(project=cfg.project, entity=cfg.entity, group=cfg.group or group,
                               tags=list(cfg.tags), name=run_name, config=config, dir=str(output_dir),
                               mode=cfg.mode.value)

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def finish(self, summary: Mapping[str, Any]) -> None:
        self._run.summary.update(dict(summary))
        self._run.finish()


class TensorBoardTracker:
    def __init__(self, cfg: TensorBoardConfig, *, output_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(output_dir / cfg.subdir))

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)

    def finish(self, summary: Mapping[str, Any]) -> None:
        self._writer.close()


def build_tracker(cfg: LoggerConfig, *, run_name: str, group: str | None, config: Dict[str, Any],
                  output_dir: Path) -> Tracker:
    if isinstance(cfg, WandbConfig):
        return WandbTracker(cfg, run_name=run_name, group=group, config=config, output_dir=output_dir)
    if isinstance(cfg, TensorBoardConfig):
        return TensorBoardTracker(cfg, output_dir=output_dir)
    return NullTracker()
