"""Calibration: how far a classifier's confidence is from how often it is right, as the expected
calibration error (ECE), the Brier score and the reliability diagram's bins; and a temperature that
rescales the model's logits to close that gap without changing any prediction.

NLI models are over-confident (Desai and Durrett, 2020), and their accuracy does not show it. The figures:

- **Confidence**: the probability of the label the model predicts, as the set counts it. After a
  relabelling (an MNLI model on HANS, where neutral's and contradiction's probabilities add up to
  non-entailment's) the predicted label, the model's most probable one mapped, need not be the most
  probable of the set's labels: the confidence is the predicted label's probability, not the largest.
- **ECE** (Naeini et al., 2015; Guo et al., 2017): the examples put in 15 equal-width confidence bins on
  [0, 1], each bin ``(i/15, (i+1)/15]`` (the first holds 0 too), and
  ``sum over bins of n_bin / n * |accuracy_bin - mean confidence_bin|``: 0 where each bin's accuracy is its
  confidence.
- **Brier score**: the multi-class one of Brier (1950), the mean over examples of the sum over classes of
  ``(p_class - 1[class is gold])^2``: 0 for certain right answers, 2 for certain wrong ones. Not the
  binary form on the confidence alone.
- **Temperature** (Guo et al., 2017): one ``T > 0`` that divides the logits, fitted by the negative
  log-likelihood of the gold labels. Dividing by ``T`` keeps every logit's order, so every prediction
  (and every metric but these) stays as it was.

All of them count the labelled examples only (label -1: none); a regression has none of them.
NumPy and SciPy, on the arrays of nli.evaluate.evaluation.Predictions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

BINS = 15  # equal-width confidence bins on [0, 1], as Guo et al. (2017) use
# Where a temperature is looked for: log T in [log 0.05, log 20], wide enough that a bound is reached only
# where the likelihood still improves past it (a model whose probabilities say nothing of the examples).
LOG_T_BOUNDS = (float(np.log(0.05)), float(np.log(20.0)))


@dataclass(frozen=True)
class Bins:
    """The reliability diagram of one split: for each of :data:`BINS` confidence bins, in order."""

    count: List[int]  # the labelled examples whose confidence falls in it
    confidence: List[Optional[float]]  # their mean confidence; None for an empty bin
    accuracy: List[Optional[float]]  # the share of them predicted right; None for an empty bin


def confidence(probabilities: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """(examples,) each example's probability of its predicted label (not the largest: see the module)."""
    return probabilities[np.arange(len(predicted)), predicted.astype(np.int64)].astype(np.float64)


def bins(probabilities: np.ndarray, predicted: np.ndarray, labels: np.ndarray) -> Bins:
    """The labelled examples' reliability bins (``probabilities``: (examples, classes); ``predicted`` and
    ``labels``: (examples,) label ids, -1 for no gold label)."""
    count, summed_confidence, summed_right = _sums(probabilities, predicted, labels)
    return Bins(count=[int(n) for n in count],
                confidence=[float(s / n) if n else None for s, n in zip(summed_confidence, count)],
                accuracy=[float(s / n) if n else None for s, n in zip(summed_right, count)])


def ece(probabilities: np.ndarray, predicted: np.ndarray, labels: np.ndarray) -> float:
    """The expected calibration error over :data:`BINS` equal-width bins; NaN without a labelled example."""
    count, summed_confidence, summed_right = _sums(probabilities, predicted, labels)
    total = count.sum()
    # n_bin / n * |right_bin / n_bin - confidence_bin / n_bin|, summed: each bin's gap in sums, over n
    return float(np.abs(summed_right - summed_confidence).sum() / total) if total else float("nan")


def _sums(probabilities: np.ndarray, predicted: np.ndarray,
          labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(BINS,) each bin's labelled examples, the sum of their confidences, and how many are right."""
    keep = labels >= 0
    confidences = confidence(probabilities[keep], predicted[keep])
    right = (predicted[keep] == labels[keep]).astype(np.float64)
    # Bin i holds (i/15, (i+1)/15]: digitize's right=True; a confidence of 0 joins the first bin.
    which = np.clip(np.digitize(confidences, np.linspace(0.0, 1.0, BINS + 1), right=True) - 1, 0, BINS - 1)
    return (np.bincount(which, minlength=BINS), np.bincount(which, weights=confidences, minlength=BINS),
            np.bincount(which, weights=right, minlength=BINS))


def brier(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """The multi-class Brier score (Brier 1950) of the labelled examples; NaN without one."""
    keep = labels >= 0
    if not keep.any():
        return float("nan")
    kept = probabilities[keep].astype(np.float64)
    gold = np.zeros_like(kept)
    gold[np.arange(len(kept)), labels[keep].astype(np.int64)] = 1.0
    return float(np.mean(np.sum((kept - gold) ** 2, axis=1)))


def scores(probabilities: Optional[np.ndarray], predicted: np.ndarray, labels: np.ndarray,
           suffix: str = "") -> Dict[str, float]:
    """``ece<suffix>`` and ``brier<suffix>`` of one eval split; none for a regression (no probabilities)."""
    if probabilities is None:
        return {}
    return {f"ece{suffix}": ece(probabilities, predicted, labels), f"brier{suffix}": brier(probabilities, labels)}


def tempered(log_probs: np.ndarray, temperature: float, label_map: Optional[np.ndarray],
             classes: int) -> np.ndarray:
    """(examples, classes) each of a set's labels' probability once the model's logits are divided by
    ``temperature``: ``log_probs`` are the model's own (examples, model labels) log-softmax, which differs
    from the logits by a constant per example, so dividing them gives the same softmax; where
    ``label_map`` maps the model's labels to the set's, each set label's is the sum of its model labels'."""
    probabilities = np.exp(log_softmax(log_probs.astype(np.float64) / temperature, axis=1))
    if label_map is None:
        return probabilities
    return probabilities @ _one_hot(label_map, classes)


def fit_temperature(log_probs: np.ndarray, labels: np.ndarray, label_map: Optional[np.ndarray],
                    classes: int) -> Optional[float]:
    """The temperature that minimises the negative log-likelihood of the labelled examples' gold labels
    (as the set counts them, through ``label_map``); None without a labelled example whose outputs are
    finite (a diverged model's NaN would make every temperature's likelihood NaN, and any of them "fitted")."""
    keep = (labels >= 0) & np.isfinite(log_probs).all(axis=1)
    if not keep.any():
        return None
    kept, gold = log_probs[keep].astype(np.float64), labels[keep].astype(np.int64)
    # counts[e, j]: whether the model's label j counts as example e's gold label (one of them, without a map)
    counts = (_one_hot(label_map, classes) if label_map is not None else np.eye(kept.shape[1]))[:, gold].T > 0

    def nll(log_t: float) -> float:
        scaled = log_softmax(kept / np.exp(log_t), axis=1)
        return float(-np.mean(np.logaddexp.reduce(np.where(counts, scaled, -np.inf), axis=1)))

    found = minimize_scalar(nll, bounds=LOG_T_BOUNDS, method="bounded", options={"xatol": 1e-7})
    return float(np.exp(found.x))


def _one_hot(label_map: np.ndarray, classes: int) -> np.ndarray:
    """(model labels, set labels) 1 where the model's label counts as the set's."""
    return (label_map[:, None] == np.arange(classes)[None, :]).astype(np.float64)
