"""Evaluation: a model's predictions and GLUE metrics over a task's splits on one process or many, the
extra evaluation sets, each class's figures, calibration, and the back-off when a GPU runs out of memory."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "evaluation": ["Evaluation", "Evaluator", "Predictions", "gather", "predict", "relabel"],
    "per_class": ["SplitAnalysis"],
}, ["calibration", "evalsets", "metrics", "oom", "per_class", "reliability"])
