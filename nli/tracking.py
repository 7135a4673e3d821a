"""Where training metrics go besides the log: any number of loggers, each a class named by its
config's ``_target_`` (``conf/logger/``). A new logger is a YAML file and a class with the three
methods of :class:`Tracker`; ``logger=[wandb,tensorboard]`` runs several at once.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Protocol

from hydra.utils import instantiate
from omegaconf import OmegaConf

from nli.config import LoggerConfig, WandbMode

log = logging.getLogger(__name__)


class RunInfo(NamedTuple):
    """What every logger is told about the run (not a dataclass: instantiate() would take that for a config)."""

    name: str  # the Hydra job's overrides (optimizer.lr=1e-05,seed=2), else the output folder's name
    group: Optional[str]  # the sweep's name: the jobs of one multirun share it
    config: Dict[str, Any]  # the resolved config
    log_dir: Path  # a local directory for the loggers' files
    resume_id: Optional[str]  # the logger's run id from the checkpoint this run resumes, if any


class Tracker(Protocol):
    run_id: Optional[str]  # kept in checkpoints, so that a resumed run logs to the same run

    def log(self, metrics: Mapping[str, float], *, step: int) -> None: ...

    def finish(self, summary: Mapping[str, Any]) -> None: ...


class WandbTracker:
    def __init__(self, *, run: RunInfo, mode: WandbMode, project: str, entity: Optional[str], group: Optional[str],
                 tags: List[str]) -> None:
        import wandb  # deferred: slow to import, and only needed with logger=wandb

        self._run = wandb.init(project=project, entity=entity, group=group or run.group, tags=list(tags),
                               name=run.name, config=run.config, dir=str(run.log_dir), mode=WandbMode(mode).value,
                               id=run.resume_id, resume="allow" if run.resume_id else None)
        self.run_id: Optional[str] = self._run.id

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def finish(self, summary: Mapping[str, Any]) -> None:
        self._run.summary.update(dict(summary))
        self._run.finish()


class TensorBoardTracker:
    run_id = None  # a resumed run appends to the same directory

    def __init__(self, *, run: RunInfo, subdir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(run.log_dir / subdir))

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)

    def finish(self, summary: Mapping[str, Any]) -> None:
        self._writer.close()


class CsvTracker:
    """Rows of ``step,metric,value``, appended as they come (a resumed run goes on in the same file)."""

    run_id = None

    def __init__(self, *, run: RunInfo, file: str) -> None:
        self._path = run.log_dir / file
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if not self._path.exists():
            self._path.write_text("step,metric,value\n")

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        with open(self._path, "a", newline="") as stream:
            csv.writer(stream).writerows((step, key, value) for key, value in metrics.items())

    def finish(self, summary: Mapping[str, Any]) -> None:
        pass


class Trackers:
    """The run's loggers, as one. A checkpoint keeps each logger's run id (``state_dict``), and a
    resumed run hands it back before the loggers start, so W&B continues the same run."""

    def __init__(self, configs: Mapping[str, LoggerConfig], *, enabled: bool = True) -> None:
        self._configs = dict(configs) if enabled else {}  # only rank 0 logs
        self._resume_ids: Dict[str, Optional[str]] = {}
        self._started: Dict[str, Tracker] = {}

    def start(self, run: RunInfo) -> None:
        for name, cfg in self._configs.items():
            info = run._replace(resume_id=self._resume_ids.get(name))
            self._started[name] = instantiate(OmegaConf.structured(cfg), run=info, _convert_="all")

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        for tracker in self._started.values():
            tracker.log(metrics, step=step)

    def finish(self, summary: Mapping[str, Any]) -> None:
        for tracker in self._started.values():
            tracker.finish(summary)

    def state_dict(self) -> Dict[str, Any]:
        return {name: tracker.run_id for name, tracker in self._started.items()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._resume_ids = dict(state)
