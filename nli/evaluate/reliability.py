"""Each split's calibration after a run, in results.json: the reliability diagram's bins of the final
evaluation, its ECE and Brier score, and both again after a temperature fitted on the dev set
(nli.evaluate.calibration says what each figure is).

Keyed as ``per_class`` is (nli.evaluate.per_class): ``validation``, ``validation_mismatched``, an extra
set's ``hans/validation``::

    "calibration": {split: {"bins": 15, "count": [n, ...], "confidence": [c, ...], "accuracy": [a, ...],
                            "ece": e, "brier": b, "temperature": t, "temperature_fitted_on": "validation",
                            "ece_after_temperature": e_t, "brier_after_temperature": b_t}}

``count``, ``confidence`` and ``accuracy`` have a value per bin, in order from confidence 0 to 1;
an empty bin's confidence and accuracy are null. The temperature is fitted once, on the run's own task's
main split (its dev set), and applied to every split, an extra set's too (Desai and Durrett's
out-of-domain question): on the split it was fitted on, the figures after it are optimistic. It
changes no prediction, metric or objective: those are the model's, as it is. A regression has none.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from nli.evaluate import calibration
from nli.evaluate.evaluation import Evaluation, Evaluator, Predictions

log = logging.getLogger(__name__)

KEY = "calibration"  # results.json's key


def results(evaluated: Sequence[Tuple[Evaluator, Evaluation]]) -> Dict[str, Any]:
    """results.json's ``calibration``, from the final evaluations (the run's own task first, as the recipe
    passes them); nothing for a regression, or where no evaluation kept its predictions."""
    fitted = _temperature(evaluated[0]) if evaluated else None
    splits: Dict[str, Any] = {}
    for evaluator, evaluation in evaluated:
        if evaluator.task.is_regression:
            continue
        for split, predictions in evaluation.predictions.items():
            splits[f"{evaluator.prefix}{split}"] = split_figures(evaluator, predictions, fitted)
    return {KEY: splits} if splits else {}


def split_figures(evaluator: Evaluator, predictions: Predictions,
                  fitted: Optional[Tuple[float, str]]) -> Dict[str, Any]:
    """One split's bins, ECE and Brier score, and (where a temperature was ``fitted``: its value and split)
    both after it."""
    probabilities = predictions.probabilities
    assert probabilities is not None, "a classification's predictions have probabilities"
    found = calibration.bins(probabilities, predictions.values, predictions.labels)
    figures: Dict[str, Any] = {"bins": calibration.BINS, "count": found.count, "confidence": found.confidence,
                               "accuracy": found.accuracy,
                               **calibration.scores(probabilities, predictions.values, predictions.labels)}
    if fitted is not None:
        temperature, fitted_on = fitted
        tempered = calibration.tempered(_own(predictions), temperature, evaluator.label_map,
                                        len(evaluator.task.label_names))
        after = calibration.scores(tempered, predictions.values, predictions.labels)
        figures.update(temperature=temperature, temperature_fitted_on=fitted_on,
                       ece_after_temperature=after["ece"], brier_after_temperature=after["brier"])
    return figures


def _temperature(own: Tuple[Evaluator, Evaluation]) -> Optional[Tuple[float, str]]:
    """The temperature fitted on the run's own task's main split, and that split's key; None for a
    regression, or where the evaluation kept no predictions."""
    evaluator, evaluation = own
    main = evaluator.task.main_split
    predictions = evaluation.predictions.get(main)
    if evaluator.task.is_regression or predictions is None:
        return None
    temperature = calibration.fit_temperature(_own(predictions), predictions.labels, evaluator.label_map,
                                              len(evaluator.task.label_names))
    if temperature is None:
        return None
    log.info("calibration: temperature %.4f fitted on %s (recorded beside; no prediction changes)", temperature,
             f"{evaluator.prefix}{main}")
    return temperature, f"{evaluator.prefix}{main}"


def _own(predictions: Predictions) -> np.ndarray:
    """The model's own log-probabilities, before any relabelling (a temperature divides those)."""
    own = predictions.log_probs if predictions.own_log_probs is None else predictions.own_log_probs
    assert own is not None, "a classification's predictions have log-probabilities"
    return own
