"""Calibration (nli/evaluate/calibration.py, nli/evaluate/reliability.py) against values worked out by hand:
the expected calibration error over 15 equal-width bins, the multi-class Brier score, the predicted label's
confidence after a relabelling (HANS), and a temperature whose best value is known in closed form."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from nli.evaluate import calibration
from nli.evaluate.evaluation import Predictions, relabel

# Six examples of three classes; the fifth has no gold label (-1) and counts for nothing. Bin i holds
# confidences in (i/15, (i+1)/15]:
#   1. 0.90, predicted 0, gold 0: right  0.90 * 15 = 13.5  -> bin 13
#   2. 0.88, predicted 0, gold 1: wrong  0.88 * 15 = 13.2  -> bin 13
#   3. 0.50, predicted 0, gold 0: right  0.50 * 15 = 7.5   -> bin 7
#   4. 0.55, predicted 1, gold 1: right  0.55 * 15 = 8.25  -> bin 8
#   5. 0.99, no gold label               left out
#   6. 0.42, predicted 0, gold 2: wrong  0.42 * 15 = 6.3   -> bin 6
# Bin 13: mean confidence 0.89, accuracy 1/2, gap 0.39, weight 2/5; bins 7, 8, 6: gaps 0.5, 0.45, 0.42,
# weight 1/5 each. ECE = 2/5 * 0.39 + (0.5 + 0.45 + 0.42) / 5 = 0.156 + 0.274 = 0.43.
PROBABILITIES = np.array([[0.90, 0.05, 0.05], [0.88, 0.07, 0.05], [0.50, 0.30, 0.20], [0.25, 0.55, 0.20],
                          [0.99, 0.005, 0.005], [0.42, 0.33, 0.25]], dtype=np.float32)
PREDICTED = np.array([0, 0, 0, 1, 0, 0])
LABELS = np.array([0, 1, 0, 1, -1, 2])
# Brier, the sum over classes of (p - gold)^2, per labelled example:
#   1. 0.1^2 + 0.05^2 + 0.05^2 = 0.015        2. 0.88^2 + 0.93^2 + 0.05^2 = 1.6418
#   3. 0.5^2 + 0.3^2 + 0.2^2 = 0.38           4. 0.25^2 + 0.45^2 + 0.2^2 = 0.305
#   6. 0.42^2 + 0.33^2 + 0.75^2 = 0.8478      mean of the five: 3.1896 / 5 = 0.63792
BRIER = 0.63792


def test_ece_over_15_equal_width_bins_is_the_one_worked_out_by_hand() -> None:
    assert calibration.BINS == 15
    assert calibration.ece(PROBABILITIES, PREDICTED, LABELS) == pytest.approx(0.43)
    found = calibration.bins(PROBABILITIES, PREDICTED, LABELS)
    assert found.count == [0] * 6 + [1, 1, 1] + [0] * 4 + [2, 0]
    assert found.confidence[13] == pytest.approx(0.89) and found.accuracy[13] == 0.5
    assert found.confidence[6:9] == pytest.approx([0.42, 0.50, 0.55]) and found.accuracy[6:9] == [0.0, 1.0, 1.0]
    assert found.confidence[0] is None and found.accuracy[14] is None  # an empty bin has neither


def test_the_brier_score_is_the_multi_class_one_worked_out_by_hand() -> None:
    assert calibration.brier(PROBABILITIES, LABELS) == pytest.approx(BRIER)
    assert calibration.scores(PROBABILITIES, PREDICTED, LABELS, suffix="_mm") == pytest.approx(
        {"ece_mm": 0.43, "brier_mm": BRIER})
    assert calibration.scores(None, np.array([0.5]), np.array([0.4])) == {}  # a regression has neither


def test_a_bins_edge_belongs_to_the_bin_below_and_a_certain_answer_to_the_last() -> None:
    edges = np.array([[0.6, 0.4], [1.0, 0.0]])  # 0.6 = 9/15 exactly: the top of bin 8
    assert calibration.bins(edges, np.array([0, 0]), np.array([0, 0])).count == [0] * 8 + [1] + [0] * 5 + [1]


def test_the_confidence_after_a_relabelling_is_the_predicted_labels_probability_not_the_largest() -> None:
    """An MNLI model on HANS: neutral and contradiction both count as non-entailment. The first pair's most probable
    label is entailment (0.4), its prediction, though non-entailment's summed probability (0.6) is larger."""
    model = Predictions(values=np.array([0, 2]), labels=np.array([0, 1]), idx=None,
                        log_probs=np.log(np.array([[0.4, 0.35, 0.25], [0.1, 0.2, 0.7]], dtype=np.float32)))
    hans = relabel(model, np.array([0, 1, 1]), 2)
    assert hans.values.tolist() == [0, 1] and hans.probabilities is not None
    assert calibration.confidence(hans.probabilities, hans.values) == pytest.approx([0.4, 0.9])
    # Both right: gaps 1 - 0.4 and 1 - 0.9, in bins of their own. The largest probability would say 0.25.
    # Brier: (0.4 - 1)^2 + 0.6^2 = 0.72 and 0.1^2 + (0.9 - 1)^2 = 0.02, mean 0.37.
    assert calibration.scores(hans.probabilities, hans.values, hans.labels) == pytest.approx(
        {"ece": 0.35, "brier": 0.37})


def test_the_temperature_is_the_one_that_makes_the_confidence_the_accuracy() -> None:
    """Four pairs, each 9 to 1 for class 0 (logits 2 ln 3 and 0), three of them right: the likelihood is best where
    class 0's probability is 3/4, which the logits divided by T give for 2 ln 3 / T = ln 3, T = 2."""
    log_probs = np.log(np.tile([[0.9, 0.1]], (4, 1)))
    labels = np.array([0, 0, 0, 1])
    temperature = calibration.fit_temperature(log_probs, labels, None, 2)
    assert temperature == pytest.approx(2.0, rel=1e-4)
    tempered = calibration.tempered(log_probs, 2.0, None, 2)
    assert tempered == pytest.approx(np.tile([[0.75, 0.25]], (4, 1)))
    predicted = np.zeros(4, dtype=np.int64)  # the same before and after: dividing the logits keeps their order
    assert calibration.scores(np.exp(log_probs), predicted, labels) == pytest.approx({"ece": 0.15, "brier": 0.42})
    # After: each bin's confidence is its accuracy, and Brier is (3 * (0.25^2 + 0.25^2) + 2 * 0.75^2) / 4 = 0.375.
    assert calibration.scores(tempered, predicted, labels) == pytest.approx({"ece": 0.0, "brier": 0.375}, abs=1e-6)


def test_a_temperature_through_a_relabelling_is_fitted_on_the_sets_labels() -> None:
    """Logits 2 ln 6, 0, 0, and neutral and contradiction counting as one label: entailment's probability is
    e^(2 ln 6 / T) / (e^(2 ln 6 / T) + 2), which is the 3 in 4 right at T = 2 (e^(ln 6) = 6, 6 / 8)."""
    logits = np.tile([[2 * math.log(6), 0.0, 0.0]], (4, 1))
    log_probs = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    label_map, labels = np.array([0, 1, 1]), np.array([0, 0, 0, 1])
    assert calibration.fit_temperature(log_probs, labels, label_map, 2) == pytest.approx(2.0, rel=1e-4)
    assert calibration.tempered(log_probs, 2.0, label_map, 2) == pytest.approx(np.tile([[0.75, 0.25]], (4, 1)))
    assert calibration.fit_temperature(log_probs, np.array([-1, -1, -1, -1]), label_map, 2) is None


def test_a_temperature_is_fitted_on_the_examples_whose_outputs_are_finite_and_on_none_where_none_are() -> None:
    """A diverged model's NaN outputs make every temperature's likelihood NaN, so a search would return one of them
    as "fitted": the examples with a NaN or infinite log-probability are left out, and with none left there is
    no temperature."""
    log_probs = np.log(np.tile([[0.9, 0.1]], (6, 1)))
    log_probs[4] = np.nan
    log_probs[5, 1] = -np.inf  # a probability that underflowed to 0: its class's log-probability is -inf
    labels = np.array([0, 0, 0, 1, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered" either
        assert calibration.fit_temperature(log_probs, labels, None, 2) == pytest.approx(2.0, rel=1e-4)
        assert calibration.fit_temperature(np.full((4, 2), np.nan), labels[:4], None, 2) is None
