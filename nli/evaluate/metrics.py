"""GLUE metrics, named as GLUE names them, computed by scikit-learn and SciPy."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
from scipy.stats import ConstantInputWarning, pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from nli.config.schema import METRIC_NAMES

Metric = Callable[[np.ndarray, np.ndarray], float]


def _correlation(correlate: Callable[[np.ndarray, np.ndarray], Any], pred: np.ndarray, ref: np.ndarray) -> float:
    """A correlation of the predictions with the references; NaN where the predictions are one score (a model
    early in training), without SciPy's warning at every evaluation: the run's end says it once for the split
    (nli.evaluate.per_class.one_score). A single pair (data.max_eval_samples=1) has none either, where SciPy raises."""
    if len(pred) < 2:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)
        return float(correlate(pred, ref)[0])


METRICS: Dict[str, Metric] = {
    "accuracy": lambda pred, ref: float(accuracy_score(ref, pred)),
    "f1": lambda pred, ref: float(f1_score(ref, pred)),  # binary, positive class 1 (MRPC, QQP)
    "matthews_correlation": lambda pred, ref: float(matthews_corrcoef(ref, pred)),
    "pearson": lambda pred, ref: _correlation(pearsonr, pred, ref),
    "spearmanr": lambda pred, ref: _correlation(spearmanr, pred, ref),
}

assert set(METRICS) == set(METRIC_NAMES), "nli.config.schema.METRIC_NAMES must list what METRICS computes"


def compute(names: List[str], predictions: np.ndarray, references: np.ndarray,
            suffix: str = "") -> Dict[str, float]:
    """``names`` on one eval split; ``suffix`` tells splits apart (MNLI mismatched: ``_mm``)."""
    scores = {f"{name}{suffix}": METRICS[name](predictions, references) for name in names}
    if len(names) > 1:  # as run_glue.py reports tasks with two metrics
        scores[f"combined_score{suffix}"] = float(np.mean([scores[f"{n}{suffix}"] for n in names]))
    return scores


def loss(references: np.ndarray, *, scores: np.ndarray, log_probs: Optional[np.ndarray]) -> float:
    """The evaluation loss over the examples with a label: the mean cross-entropy of the classes'
    ``log_probs`` (a classification), else the mean squared error of the ``scores`` (a regression), as
    the model's loss in training counts it (without label smoothing)."""
    if log_probs is None:
        return float(np.mean((scores.astype(np.float64) - references) ** 2))
    labelled = references >= 0  # -1: no gold label
    gold = log_probs[labelled, references[labelled].astype(np.int64)]
    return float(-np.mean(gold.astype(np.float64)))


def by_group(predictions: np.ndarray, references: np.ndarray, groups: Mapping[str, Sequence[str]],
             label_names: Sequence[str], suffix: str = "") -> Dict[str, float]:
    """Accuracy on the examples of each value of each ``groups`` column (``accuracy_<value>``), and on
    those of each value with each gold label (``accuracy_<value>_<label>``), as McCoy et al. (2019) report
    HANS: e.g. accuracy_lexical_overlap_non-entailment, where MNLI models fail."""
    scores: Dict[str, float] = {}
    for values in groups.values():
        column = np.asarray(values)
        for value in np.unique(column):  # sorted
            members = column == value
            scores[f"accuracy_{value}{suffix}"] = float(accuracy_score(references[members], predictions[members]))
            for label, name in enumerate(label_names):
                both = members & (references == label)
                if both.any():  # a value without examples of a label has no accuracy on them
                    scores[f"accuracy_{value}_{name}{suffix}"] = float(accuracy_score(references[both],
                                                                                      predictions[both]))
    return scores
