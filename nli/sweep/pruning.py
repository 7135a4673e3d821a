"""Pruning: a search stops its trials that the study's pruner gives up, while they train.

A trial reaches the study through its own run folder, local, shared or gs:// (a Vertex AI job cannot reach
the study's storage): the run writes each evaluation's step and objective to ``evaluations.jsonl`` there
(nli.train.hooks.Pruning); a thread of the sweep's process reads the folders of the trials in flight every
``poll_interval`` seconds, reports what is new to the study, asks the pruner, and for a trial it gives up
writes ``prune.json`` into the folder. The run ends at its next evaluation, as early stopping ends it, its
best checkpoint the model and its results.json ``status: pruned``; the study has it PRUNED.

Light on purpose (no torch): the sweep's own process runs it.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Dict, Optional

import optuna
from omegaconf import DictConfig, OmegaConf, open_dict

from nli.contract import EVALUATIONS_FILE, PRUNE_FILE, PRUNED, RESULTS_FILE
from nli.io.storage import Storage

log = logging.getLogger(__name__)


def run_folder(config: DictConfig, job: DictConfig, num: int) -> str:
    """Where job ``num`` of a sweep run by one of Hydra's launchers writes, as the app decides it (nli.cli), from
    the job's composed config (``load_sweep_config``, its ``hydra.job.num`` set here): ``output_dir`` where it sets
    it, else its Hydra sweep subdirectory."""
    with open_dict(job.hydra.job):
        job.hydra.job.num = num
    explicit = OmegaConf.select(job, "output_dir")
    if explicit:
        return str(explicit) if "://" in str(explicit) else str(Path(str(explicit)).absolute())
    return str(Path(str(config.hydra.sweep.dir), str(job.hydra.sweep.subdir)).absolute())


def ended_pruned(folder: Optional[str]) -> bool:
    """Whether the run in ``folder`` ended pruned (its results.json says so)."""
    if folder is None:
        return False
    results = Storage(folder, key="the trial's folder").read_json(RESULTS_FILE)
    return isinstance(results, dict) and results.get("status") == PRUNED


class _Watched:
    def __init__(self, trial: optuna.Trial, folder: str) -> None:
        self.trial, self.storage = trial, Storage(folder, key="the trial's folder")
        self.reported: set[int] = set()
        self.pruned = False


class Watch:
    """The trials in flight, read every ``interval`` seconds in a thread of the sweep's process."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.trials: Dict[int, _Watched] = {}
        self.lock = threading.Lock()  # one look at a time: the thread's, or the main thread's last one
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pruning", daemon=True)

    def __enter__(self) -> "Watch":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=self.interval + 30)

    def add(self, trial: optuna.Trial, folder: str) -> None:
        with self.lock:
            self.trials[trial.number] = _Watched(trial, folder)

    def last(self, trial: optuna.Trial) -> None:
        """A last look at an ended trial, before the study is told its end (a pruner compares trials by the
        values each reported at each step), and no more. Its values are reported, not judged: a run that has
        ended cannot be stopped, and a prune.json written into its folder would stop it, pruned, if it were ever
        continued (more train.max_steps), as it would say it was given up when the study has it complete."""
        with self.lock:
            watched = self.trials.pop(trial.number, None)
            if watched is not None:
                self._look(watched, judge=False)

    def _run(self) -> None:
        while not self.done.wait(self.interval):
            with self.lock:
                for watched in list(self.trials.values()):
                    try:
                        self._look(watched)
                    except Exception as error:  # the study's storage busy, say: the watch goes on
                        log.warning("trial %d: its evaluations could not reach the study (%s); trying again in "
                                    "%g s", watched.trial.number, error, self.interval)

    def _look(self, watched: _Watched, *, judge: bool = True) -> None:
        try:
            text = watched.storage.read_bytes(EVALUATIONS_FILE).decode()
        except FileNotFoundError:
            return  # no evaluation yet
        except Exception as error:  # a bucket's hiccup: the next look tries again; the trial trains on
            log.debug("trial %d: %s unread (%s)", watched.trial.number, EVALUATIONS_FILE, error)
            return
        for line in text.splitlines():
            try:
                reported = json.loads(line)
                step, value = int(reported["step"]), float(reported["objective"])
            except (ValueError, KeyError, TypeError):
                continue  # a line being written
            if step in watched.reported:
                continue
            watched.trial.report(value, step)
            watched.reported.add(step)
            if judge and not watched.pruned and watched.trial.should_prune():
                self._prune(watched, step, value)

    def _prune(self, watched: _Watched, step: int, value: float) -> None:
        why = f"the study's pruner gave trial {watched.trial.number} up at step {step} (objective {value:.4g})"
        try:
            watched.storage.write_text(PRUNE_FILE, json.dumps({"trial": watched.trial.number, "step": step,
                                                               "why": why}) + "\n")
        except Exception as error:  # the next look tries again
            log.warning("trial %d: could not write %s (%s)", watched.trial.number, PRUNE_FILE, error)
            return
        watched.pruned = True
        log.info("%s: it stops at its next evaluation", why)
