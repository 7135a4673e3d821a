"""Test-set predictions in the GLUE submission format.

One ``<TASK>.tsv`` per test split (MNLI: ``MNLI-m.tsv``, ``MNLI-mm.tsv``, and ``AX.tsv`` for GLUE's
diagnostic set where it is at hand: TaskConfig.diagnostic), tab-separated with
the header ``index	prediction``: each example's index as its test file gives it (GLUE's ``index``, a
file of your own's ``idx``, ``index`` or ``id``, numbers or text: nli.data.sources), and classes written
as GLUE's own files write them (``0``/``1`` for CoLA, SST-2, MRPC, QQP and WNLI; label names for
MNLI, QNLI, RTE and AX), scores for STS-B.
``python -m nli.report submission`` zips the nine tasks' runs' files for gluebenchmark.com (nli.sweep.leaderboard).
"""

from __future__ import annotations

import csv
import io
import logging
from typing import Dict, List, Tuple

import torch
from torch.utils.data import DataLoader

from nli import contract
from nli.config.schema import TaskConfig
from nli.evaluate import oom
from nli.evaluate.evaluation import Predictions, gather, predict, relabel
from nli.io.storage import Storage
from nli.runtime.distributed import World

log = logging.getLogger(__name__)


def write_predictions(task: TaskConfig, loaders: Dict[str, DataLoader], model: torch.nn.Module,
                      evaluations: oom.Evaluations, storage: Storage, world: World) -> List[str]:
    """Each test split's predictions in GLUE's submission format, under predictions/: in the batches the
    evaluations found to fit (or smaller, where these do not), with their labels' map. The files' paths."""
    evaluator, size = evaluations.evaluator, evaluations.batch_size()
    written: List[str] = []
    for split, loader in loaders.items():
        predicted, size = oom.fitting(lambda each: relabel(gather(predict(model, each, task, evaluator.compute),
                                                                  world), evaluator.label_map),
                                      oom.at_most(loader, size), evaluator.compute, world)
        name, text = submission(task, split, predicted)
        if world.is_main:
            storage.write_text(f"{contract.PREDICTIONS_DIR}/{name}", text)
        written.append(f"{contract.PREDICTIONS_DIR}/{name}")
        log.info("test predictions for %s written to %s", split, storage.describe(contract.PREDICTIONS_DIR, name))
    return written


def submission(task: TaskConfig, split: str, predictions: Predictions) -> Tuple[str, str]:
    """The file name and contents of the submission for test split ``split``."""
    assert predictions.idx is not None, "test splits keep their examples' ids (idx)"
    if task.is_regression:
        column = [f"{score:.3f}" for score in predictions.values]
    else:
        names = task.file_labels
        column = [names[i] for i in predictions.values]
    text = io.StringIO()
    writer = csv.writer(text, delimiter="\t", lineterminator="\n")
    writer.writerow(["index", "prediction"])
    writer.writerows(zip(predictions.idx.tolist(), column))
    return f"{task.submission_file(split)}.tsv", text.getvalue()
