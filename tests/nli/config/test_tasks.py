"""The GLUE task table: every task's config, and its metrics on small hand-checked examples."""

from __future__ import annotations

from typing import Dict

import numpy as np
import pytest

from nli.config.schema import TaskConfig
from nli.evaluate import metrics
from tests.conftest import build_config

# What the Hub's nyu-mll/glue holds and how GLUE scores each task, written out by hand:
# input columns, label names in id order, metrics, eval splits -> metric suffix, submission files.
GLUE = {
    "cola": (["sentence"], ["unacceptable", "acceptable"], ["matthews_correlation"], {"validation": ""}, ["CoLA"]),
    "sst2": (["sentence"], ["negative", "positive"], ["accuracy"], {"validation": ""}, ["SST-2"]),
    "mrpc": (["sentence1", "sentence2"], ["not_equivalent", "equivalent"], ["f1", "accuracy"], {"validation": ""},
             ["MRPC"]),
    "qqp": (["question1", "question2"], ["not_duplicate", "duplicate"], ["f1", "accuracy"], {"validation": ""},
            ["QQP"]),
    "stsb": (["sentence1", "sentence2"], [], ["pearson", "spearmanr"], {"validation": ""}, ["STS-B"]),
    "mnli": (["premise", "hypothesis"], ["entailment", "neutral", "contradiction"], ["accuracy"],
             {"validation_matched": "", "validation_mismatched": "_mm"}, ["MNLI-m", "MNLI-mm"]),
    "qnli": (["question", "sentence"], ["entailment", "not_entailment"], ["accuracy"], {"validation": ""}, ["QNLI"]),
    "rte": (["sentence1", "sentence2"], ["entailment", "not_entailment"], ["accuracy"], {"validation": ""}, ["RTE"]),
    "wnli": (["sentence1", "sentence2"], ["not_entailment", "entailment"], ["accuracy"], {"validation": ""}, ["WNLI"]),
}


def task(name: str) -> TaskConfig:
    return build_config([f"task={name}"]).task


@pytest.mark.parametrize("name", sorted(GLUE))
def test_task_config_matches_the_hub_and_glue(name: str) -> None:
    fields, labels, names, eval_splits, submissions = GLUE[name]
    cfg = task(name)
    assert (cfg.name, cfg.hub_dataset, cfg.hub_config) == (name, "nyu-mll/glue", name)
    assert cfg.text_fields == fields and cfg.label_names == labels and cfg.metrics == names
    assert cfg.eval_splits == eval_splits and sorted(cfg.test_splits.values()) == submissions
    assert cfg.is_regression == (name == "stsb") and cfg.num_labels == max(len(labels), 1)
    # Tasks with two metrics are scored by their mean, as GLUE's leaderboard scores them.
    assert cfg.main_metric == ("combined_score" if len(names) > 1 else names[0])
    assert cfg.glue is not None and set(cfg.glue.files) >= {"train", *eval_splits, *cfg.test_splits}


# Per task: predictions, references, and the scores worked out by hand.
HAND_CHECKED: Dict[str, tuple] = {
    # tp=2 fp=1 fn=1 tn=1: MCC = (2*1 - 1*1) / sqrt(3 * 3 * 2 * 2) = 1/6
    "cola": ([1, 1, 1, 0, 0], [1, 1, 0, 0, 1], {"matthews_correlation": 1 / 6}),
    "sst2": ([1, 0, 1, 1], [1, 0, 0, 1], {"accuracy": 0.75}),
    # tp=2 fp=1 fn=1 tn=2: F1 = 2*2 / (2*2 + 1 + 1) = 2/3, accuracy 4/6
    "mrpc": ([1, 1, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0], {"f1": 2 / 3, "accuracy": 2 / 3, "combined_score": 2 / 3}),
    # tp=1 fp=0 fn=2 tn=1: F1 = 2 / (2 + 0 + 2) = 0.5, accuracy 2/4
    "qqp": ([1, 0, 0, 0], [1, 1, 1, 0], {"f1": 0.5, "accuracy": 0.5, "combined_score": 0.5}),
    # Deviations (-1.5, -0.5, 0.5, 1.5) and (-2, -1, 0, 3): Pearson = (3 + 0.5 + 0 + 4.5) / sqrt(5 * 14);
    # the ranks agree, so Spearman is 1.
    "stsb": ([1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 2.0, 5.0],
             {"pearson": 8 / np.sqrt(70), "spearmanr": 1.0, "combined_score": (8 / np.sqrt(70) + 1) / 2}),
    "mnli": ([0, 1, 2, 2, 1], [0, 1, 2, 1, 1], {"accuracy": 0.8}),
    "qnli": ([0, 1], [1, 1], {"accuracy": 0.5}),
    "rte": ([0, 0, 1], [0, 1, 1], {"accuracy": 2 / 3}),
    "wnli": ([1, 1, 1, 1], [1, 0, 0, 0], {"accuracy": 0.25}),
}


@pytest.mark.parametrize("name", sorted(HAND_CHECKED))
def test_task_metrics_agree_with_hand_checked_values(name: str) -> None:
    pred, ref, expected = HAND_CHECKED[name]
    cfg = task(name)
    scores = metrics.compute(cfg.metrics, np.array(pred), np.array(ref))
    assert scores == pytest.approx(expected)
    assert cfg.main_metric in scores


def test_mnli_mismatched_metrics_carry_the_suffix() -> None:
    cfg = task("mnli")
    suffix = cfg.eval_splits["validation_mismatched"]
    assert metrics.compute(cfg.metrics, np.array([0, 2]), np.array([0, 1]), suffix=suffix) == {"accuracy_mm": 0.5}
