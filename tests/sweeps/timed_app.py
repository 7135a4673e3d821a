"""A task that takes as long as its job number says, for the search's scheduling (nli.sweep.slots): job 0
sleeps ``long`` seconds, every other ``short``; each appends a line to ``log`` when it starts and when it ends."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(config_path="timed", config_name="timed", version_base="1.3")
def main(cfg: DictConfig) -> float:
    num = int(HydraConfig.get().job.num)
    _note(cfg.log, job=num, started=time.time(), pid=os.getpid(), x=cfg.x)
    time.sleep(cfg.long if num == 0 else cfg.short)
    _note(cfg.log, job=num, ended=time.time())
    return float(cfg.x)


def _note(log: str, **line: object) -> None:
    with open(Path(log), "a") as stream:
        stream.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
