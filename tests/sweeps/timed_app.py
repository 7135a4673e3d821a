"""A task that takes as long as its job number says, for the search's scheduling (nli.sweep.slots): job 0 runs
until ``others`` other jobs have ended, or for ``long`` seconds at most (``others=0``: ``long`` seconds), every
other job ``short`` seconds; each appends a line to ``log`` when it starts and when it ends. Job 0 waiting on the
others, not on the clock, makes "the others ended before job 0" hold however busy the machine is, where the
others can run beside it, and fail (after ``long`` seconds) where they cannot. ``TIMED_LONG`` and ``TIMED_SHORT`` in
the environment replace ``long`` and ``short``: the same command run again, faster, where a study refuses other
settings (nli.sweep.search.check_fixed)."""

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
    if num == 0:
        _until_ended(Path(cfg.log), cfg.others, time.monotonic() + _seconds(cfg, "long"))
    else:
        time.sleep(_seconds(cfg, "short"))
    _note(cfg.log, job=num, ended=time.time())
    return float(cfg.x)


def _seconds(cfg: DictConfig, key: str) -> float:
    return float(os.environ.get(f"TIMED_{key.upper()}", cfg[key]))


def _until_ended(log: Path, others: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if others and sum('"ended"' in line for line in log.read_text().splitlines()) >= others:
            return
        time.sleep(0.1)


def _note(log: str, **line: object) -> None:
    with open(Path(log), "a") as stream:
        stream.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
