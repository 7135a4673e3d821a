"""Where training metrics go: nowhere but the log, Weights & Biases, or TensorBoard."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Protocol

from nli.config import LoggerConfig, TensorBoardConfig, WandbConfig

log = logging.getLogger(__name__)


class Tracker(Protocol):
    run_id: Optional[str]  # kept in checkpoints, so that a resumed run logs to the same run

    def log(self, metrics: Mapping[str, float], *, step: int) -> None: ...

    def finish(self, summary: Mapping[str, Any]) -> None: ...


class NullTracker:
    run_id = None

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        pass

    def finish(self, summary: Mapping[str, Any]) -> None:
        pass


class WandbTracker:
    def __init__(self, cfg: WandbConfig, *, run_name: str, group: str | None, config: Dict[str, Any],
                 log_dir: Path, resume_id: Optional[str]) -> None:
        import wandb  # deferred: slow to import, and only needed with logger=wandb

        self._run = wandb.init(project=cfg.project, entity=cfg.entity, group=cfg.group or group,
                               tags=list(cfg.tags), name=run_name, config=config, dir=str(log_dir),
                               mode=cfg.mode.value, id=resume_id, resume="allow" if resume_id else None)
        self.run_id: Optional[str] = self._run.id

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def finish(self, summary: Mapping[str, Any]) -> None:
        self._run.summary.update(dict(summary))
        self._run.finish()


class TensorBoardTracker:
    run_id = None  # a resumed run appends to the same directory

    def __init__(self, cfg: TensorBoardConfig, *, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir / cfg.subdir))

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)

    def finish(self, summary: Mapping[str, Any]) -> None:
        self._writer.close()


def build_tracker(cfg: LoggerConfig, *, run_name: str, group: str | None, config: Dict[str, Any],
                  log_dir: Path, resume_id: Optional[str]) -> Tracker:
    if isinstance(cfg, WandbConfig):
        return WandbTracker(cfg, run_name=run_name, group=group, config=config, log_dir=log_dir,
                            resume_id=resume_id)
    if isinstance(cfg, TensorBoardConfig):
        return TensorBoardTracker(cfg, log_dir=log_dir)
    return NullTracker()
