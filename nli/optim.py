"""The learning-rate schedules by the class paths that configs name (``schedule._target_: nli.optim.linear``),
where run folders recorded them as part of each run's identity: they live in nli/train/optim.py."""

from nli.train.optim import constant, cosine, linear

__all__ = ["constant", "cosine", "linear"]
