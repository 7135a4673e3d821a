"""Evaluation: a model's predictions and GLUE metrics over a task's splits on one process or many, the
extra evaluation sets, each class's figures, and the back-off when a GPU runs out of memory.

- ``evaluation``: predictions and metrics over a task's splits
- ``evalsets``: evaluation sets (eval.extra: SNLI, ANLI, HANS) and a model's labels matched to a set's
- ``metrics``: GLUE's metrics and the evaluation loss, from scikit-learn and SciPy
- ``per_class``: each class's precision, recall and F1, the confusion matrix, each example's prediction
- ``oom``: out of GPU memory: a step again in half-size micro-batches, an evaluation in smaller batches"""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "evaluation": ["Evaluation", "Evaluator", "Predictions", "gather", "predict", "relabel"],
    "per_class": ["SplitAnalysis"],
}, ["evalsets", "metrics", "oom", "per_class"])
