"""GLUE's metrics (nli/evaluate/metrics.py) against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from nli.evaluate import metrics


def test_metrics_agree_with_hand_computed_values() -> None:
    pred, ref = np.array([1, 0, 1, 1, 0, 1]), np.array([1, 0, 0, 1, 1, 1])
    # tp=3 fp=1 fn=1 tn=1: accuracy 4/6, F1 = 2*3 / (2*3 + 1 + 1) = 0.75,
    # MCC = (3*1 - 1*1) / sqrt(4 * 4 * 2 * 2) = 2 / 8.
    scores = metrics.compute(["accuracy", "f1", "matthews_correlation"], pred, ref)
    assert scores["accuracy"] == pytest.approx(4 / 6)
    assert scores["f1"] == pytest.approx(0.75)
    assert scores["matthews_correlation"] == pytest.approx(0.25)
    assert scores["combined_score"] == pytest.approx(np.mean([4 / 6, 0.75, 0.25]))


def test_correlations_and_split_suffix() -> None:
    pred, ref = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 6.0, 9.0])
    scores = metrics.compute(["pearson", "spearmanr"], pred, ref, suffix="_mm")
    assert scores["spearmanr_mm"] == pytest.approx(1.0)  # same order
    assert scores["pearson_mm"] == pytest.approx(np.corrcoef(pred, ref)[0, 1])
    assert set(scores) == {"pearson_mm", "spearmanr_mm", "combined_score_mm"}
