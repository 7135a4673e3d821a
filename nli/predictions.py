"""Test-set predictions in the GLUE submission format.

One ``<TASK>.tsv`` per test split (MNLI: ``MNLI-m.tsv`` and ``MNLI-mm.tsv``), tab-separated with
the header ``index	prediction``: classes written as GLUE's own files write them (``0``/``1``
for CoLA, SST-2, MRPC, QQP and WNLI; label names for MNLI, QNLI and RTE), scores for STS-B.
Zip the files of a run's ``predictions/`` folder to submit them to gluebenchmark.com.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from nli.config import TaskConfig
from nli.loop import Predictions


def write_submission(directory: Path, task: TaskConfig, split: str, predictions: Predictions) -> Path:
    """Write ``predictions`` of test split ``split`` to ``directory``; return the file's path."""
    assert predictions.idx is not None, "test splits keep their example numbers (idx)"
    if task.is_regression:
        column = [f"{score:.3f}" for score in predictions.values]
    else:
        names = task.file_labels
        column = [names[i] for i in predictions.values]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{task.test_splits[split]}.tsv"
    staging = path.with_name(path.name + ".tmp")
    with open(staging, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["index", "prediction"])
        writer.writerows(zip(predictions.idx.tolist(), column))
    os.replace(staging, path)  # a file is complete or absent, never half-written
    return path
