"""Test-set predictions in the GLUE submission format.

One ``<TASK>.tsv`` per test split (MNLI: ``MNLI-m.tsv`` and ``MNLI-mm.tsv``), tab-separated with
the header ``index	prediction``: each example's index as its test file gives it (GLUE's ``index``, a
file of your own's ``idx``, ``index`` or ``id``, numbers or text: nli.data.sources), and classes written
as GLUE's own files write them (``0``/``1`` for CoLA, SST-2, MRPC, QQP and WNLI; label names for
MNLI, QNLI and RTE), scores for STS-B.
Zip the files of a run's ``predictions/`` folder to submit them to gluebenchmark.com.
"""

from __future__ import annotations

import csv
import io
from typing import Tuple

from nli.config.schema import TaskConfig
from nli.evaluate.evaluation import Predictions


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
    return f"{task.test_splits[split]}.tsv", text.getvalue()
