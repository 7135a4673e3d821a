"""GLUE metrics, named as GLUE names them, computed by scikit-learn and SciPy."""

from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from nli.config import METRIC_NAMES

Metric = Callable[[np.ndarray, np.ndarray], float]

METRICS: Dict[str, Metric] = {
    "accuracy": lambda pred, ref: float(accuracy_score(ref, pred)),
    "f1": lambda pred, ref: float(f1_score(ref, pred)),  # binary, positive class 1 (MRPC, QQP)
    "matthews_correlation": lambda pred, ref: float(matthews_corrcoef(ref, pred)),
    "pearson": lambda pred, ref: float(pearsonr(pred, ref)[0]),
    "spearmanr": lambda pred, ref: float(spearmanr(pred, ref)[0]),
}

assert set(METRICS) == set(METRIC_NAMES), "nli.config.METRIC_NAMES must list what METRICS computes"


def compute(names: List[str], predictions: np.ndarray, references: np.ndarray,
            suffix: str = "") -> Dict[str, float]:
    """``names`` on one eval split; ``suffix`` tells splits apart (MNLI mismatched: ``_mm``)."""
    scores = {f"{name}{suffix}": METRICS[name](predictions, references) for name in names}
    if len(names) > 1:  # as run_glue.py reports tasks with two metrics
        scores[f"combined_score{suffix}"] = float(np.mean([scores[f"{n}{suffix}"] for n in names]))
    return scores
