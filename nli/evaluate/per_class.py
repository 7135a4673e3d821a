"""What a researcher looks at after a run: each class's precision, recall and F1, the confusion
matrix, and every eval example's prediction.

They come from the run's final evaluation (of the best checkpoint), one eval split at a time, keyed
by the split's name (``validation``; MNLI's ``validation_matched`` and ``validation_mismatched``) and,
for eval.extra's sets, by set and split (``hans/validation``). In results.json::

    "per_class": {split: {label: {"precision": p, "recall": r, "f1": f, "support": n}}}
    "confusion_matrix": {split: {"labels": [label, ...], "matrix": [[count, ...], ...]}}

the matrix's rows are the gold labels and its columns the predicted ones, in the task's label order
(scikit-learn's ``confusion_matrix``): every label has a row and a column, predicted or not, and
the counts sum to the split's size. A class never predicted has precision 0 (scikit-learn's
``zero_division=0``). A regression (STS-B) has neither: its scores have no classes.

``eval_predictions/<split>.jsonl`` (``eval_predictions/hans/validation.jsonl``) holds one JSON object
per example, in the split's order: ``idx`` (the example's number in its source), the task's text
fields (and ``task.groups`` columns: HANS's ``heuristic``), ``label`` (the gold label's name) and
``prediction`` (the predicted label's name), and ``probability_<label>`` for each label (the
softmax); for a regression, ``label`` and ``prediction`` are scores. ``pandas.read_json(path,
lines=True)`` and ``datasets.load_dataset("json", data_files=path)`` read it as it is.
``eval.save_predictions=false`` writes none.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import datasets
import numpy as np
from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

from nli.config.schema import TaskConfig
from nli.contract import CLASS_FIGURES, EVAL_PREDICTIONS_DIR
from nli.evaluate.evaluation import Evaluation, Evaluator, Predictions

log = logging.getLogger(__name__)

FOLDER = EVAL_PREDICTIONS_DIR


@dataclass(frozen=True)
class SplitAnalysis:
    """One classification split's figures, as results.json and the loggers hold them."""

    split: str  # its key: the split's name, after an extra set's name and a slash (hans/validation)
    labels: List[str]  # the task's label names, in id order
    per_class: Dict[str, Dict[str, float]]  # label -> precision, recall, f1, support
    matrix: List[List[int]]  # rows: gold labels; columns: predicted labels


def one_class(analysis: SplitAnalysis) -> Optional[str]:
    """A warning where the model predicts one class for every example of a split whose gold labels are several: its
    accuracy is then that class's share, and says nothing else (a tiny model from scratch on RTE ends so)."""
    matrix = analysis.matrix
    predicted = [j for j in range(len(analysis.labels)) if any(row[j] for row in matrix)]
    if len(predicted) != 1 or sum(1 for row in matrix if sum(row)) < 2:
        return None
    total, only = sum(map(sum, matrix)), predicted[0]
    return (f"{analysis.split}: the model predicts {analysis.labels[only]} for all {total} examples, so its accuracy "
            f"({matrix[only][only] / total:.4f}) is that class's share: it has learnt nothing the labels' counts do "
            "not give. Train longer or at another learning rate, or start from a pretrained model")


def absent(analysis: SplitAnalysis) -> Optional[str]:
    """A warning where some of the task's labels have no gold example in the split (a few examples kept by
    data.max_eval_samples, a file of your own): their recall and F1 are 0 in per_class, scikit-learn's word for 0 of
    0, which reads as a model that never finds them."""
    missing = [label for label, row in zip(analysis.labels, analysis.matrix) if not sum(row)]
    total = sum(map(sum, analysis.matrix))
    if not missing or not total:
        return None
    which, named = ("that label's" if len(missing) == 1 else "those labels'"), " or ".join(missing)
    none = (f"its one example is not labelled {named}" if total == 1 else
            f"none of its {total} examples is labelled {named}")
    return (f"{analysis.split}: {none}, so {which} recall and "
            "F1 (0 in results.json's per_class) say nothing of the model: evaluate on more of the split "
            "(data.max_eval_samples) or on examples of every label")


def non_finite(evaluated: Sequence[Tuple[Evaluator, Evaluation]]) -> Dict[str, str]:
    """A warning for each split (by its key) where the model's outputs are NaN or infinite for some examples: their
    predictions are the argmax of NaN, and every figure that counts them says nothing of the model. A run whose
    weights diverged ends so where train.skip_nonfinite let it go on; so does an fp16 evaluation that overflows."""
    found: Dict[str, str] = {}
    for _, key, predictions in _splits(evaluated):
        finite = np.isfinite(predictions.values if predictions.log_probs is None else predictions.log_probs)
        bad = int((~(finite if finite.ndim == 1 else finite.all(axis=1))).sum())  # examples, not values
        if bad:
            found[key] = (f"{key}: the model's outputs are NaN or infinite for {bad} of {len(finite)} examples, so "
                          "its predictions there, and the figures that count them, mean nothing: the model "
                          "diverged. Lower optimizer.lr, clip gradients (train.max_grad_norm), or compute in bf16 or "
                          "fp32 where fp16 overflows")
    return found


def one_score(evaluated: Sequence[Tuple[Evaluator, Evaluation]]) -> Dict[str, str]:
    """A warning for each regression split (by its key) whose correlations with the gold scores are undefined (NaN),
    the split's objective among them: its gold scores are one (a split of one example, or of pairs scored alike),
    or the model predicts one score for every example."""
    found: Dict[str, str] = {}
    for evaluator, key, predictions in _splits(evaluated):
        scores, gold = predictions.values, predictions.labels
        if not evaluator.task.is_regression or not len(gold):
            continue
        if (gold == gold[0]).all():
            found[key] = (f"{key}: its {_examples(len(gold))} the gold score {float(gold[0]):.4g}, so the correlations "
                          "with it are undefined (NaN) whatever the model predicts: evaluate on pairs whose scores "
                          "differ (data.max_eval_samples, the split's file)")
        elif np.isfinite(scores).all() and (scores == scores[0]).all():
            found[key] = (f"{key}: the model predicts the score {float(scores[0]):.4g} for all {len(scores)} examples, "
                          "so its correlations with the gold scores are undefined (NaN). Train longer or at another "
                          "learning rate, or start from a pretrained model")
    return found


def _examples(count: int) -> str:
    return "one example has" if count == 1 else f"{count} examples all have"


def warnings_of(evaluated: Sequence[Tuple[Evaluator, Evaluation]], analyses: Sequence[SplitAnalysis]) -> List[str]:
    """Every warning the predictions call for (``analyses``: theirs, :func:`analyse`): NaN outputs, one class, a
    label without gold examples, one score. A split whose outputs are NaN predicts one class for that reason alone:
    its warning is the NaN's."""
    diverged = non_finite(evaluated)
    one = [one_class(each) for each in analyses if each.split not in diverged]
    missing = [absent(each) for each in analyses]
    return [warning for warning in [*diverged.values(), *one, *missing, *one_score(evaluated).values()] if warning]


def _splits(evaluated: Sequence[Tuple[Evaluator, Evaluation]]) -> Iterator[Tuple[Evaluator, str, Predictions]]:
    """Each split that each evaluation predicted: its evaluator, its key (:func:`split_key`) and its predictions."""
    for evaluator, evaluation in evaluated:
        for split, predictions in evaluation.predictions.items():
            yield evaluator, split_key(evaluator, split), predictions


def per_class(predictions: Predictions, labels: Sequence[str]) -> Dict[str, Dict[str, float]]:
    """Each label's precision, recall, F1 and support (its gold examples) on the labelled examples."""
    gold, predicted = _labelled(predictions)
    with warnings.catch_warnings():  # a class never predicted: precision 0, as zero_division says
        warnings.simplefilter("ignore")
        figures = precision_recall_fscore_support(gold, predicted, labels=list(range(len(labels))), zero_division=0)
    return {label: {name: (int(values[i]) if name == "support" else float(values[i]))
                    for name, values in zip(CLASS_FIGURES, figures)} for i, label in enumerate(labels)}


def confusion(predictions: Predictions, labels: Sequence[str]) -> List[List[int]]:
    """Counts of gold label (row) x predicted label (column), every label of the task included."""
    gold, predicted = _labelled(predictions)
    return confusion_matrix(gold, predicted, labels=list(range(len(labels)))).tolist()


def _labelled(predictions: Predictions) -> Tuple[np.ndarray, np.ndarray]:
    keep = predictions.labels >= 0  # -1: no gold label (a split's such examples are left out when it loads)
    return predictions.labels[keep].astype(np.int64), predictions.values[keep].astype(np.int64)


def analyse(evaluated: Sequence[Tuple[Evaluator, Evaluation]]) -> List[SplitAnalysis]:
    """The figures of each classification split that each evaluation predicted."""
    found: List[SplitAnalysis] = []
    for evaluator, evaluation in evaluated:
        labels = list(evaluator.task.label_names)
        if not evaluation.predictions:  # one read back from a checkpoint or export.json keeps its metrics only
            log.warning("the evaluation of step %d holds no predictions: no per-class figures or predictions files "
                        "for %s", evaluation.step, evaluator.prefix.rstrip("/") or evaluator.task.name)
        if evaluator.task.is_regression:
            continue
        for split, predictions in evaluation.predictions.items():
            found.append(SplitAnalysis(split_key(evaluator, split), labels, per_class(predictions, labels),
                                       confusion(predictions, labels)))
    return found


def split_key(evaluator: Evaluator, split: str) -> str:
    """``validation_matched``; an extra set's ``hans/validation`` (its prefix is ``hans/``)."""
    return f"{evaluator.prefix}{split}"


def results(analyses: Sequence[SplitAnalysis]) -> Dict[str, Any]:
    """results.json's ``per_class`` and ``confusion_matrix``; nothing for a regression."""
    if not analyses:
        return {}
    return {"per_class": {each.split: each.per_class for each in analyses},
            "confusion_matrix": {each.split: {"labels": each.labels, "matrix": each.matrix} for each in analyses}}


def rows(task: TaskConfig, predictions: Predictions, examples: datasets.Dataset) -> Iterator[Dict[str, Any]]:
    """Each example of a split with its prediction, in order (see the module's docstring)."""
    assert len(examples) == len(predictions.values), "the examples are the split's, in its order"
    columns = ["idx", *task.text_fields, *task.groups]
    names = list(task.label_names)
    probabilities = predictions.probabilities
    for i, example in enumerate(examples.select_columns(columns)):
        row = dict(example)
        if task.is_regression:
            row.update(label=float(predictions.labels[i]), prediction=float(predictions.values[i]))
        else:
            gold = int(predictions.labels[i])
            row.update(label=names[gold] if gold >= 0 else None, prediction=names[int(predictions.values[i])])
            assert probabilities is not None
            row.update({f"probability_{name}": float(p) for name, p in zip(names, probabilities[i])})
        yield row


def files(evaluated: Sequence[Tuple[Evaluator, Evaluation]]) -> Iterator[Tuple[str, str]]:
    """Each eval split's predictions file: its path under the run folder and its text (JSON Lines)."""
    for evaluator, evaluation in evaluated:
        for split, predictions in evaluation.predictions.items():
            if split not in evaluator.examples:
                continue
            text = "".join(json.dumps(row, ensure_ascii=False) + "\n"
                           for row in rows(evaluator.task, predictions, evaluator.examples[split]))
            yield f"{FOLDER}/{split_key(evaluator, split)}.jsonl", text
