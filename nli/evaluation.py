"""A model's predictions and GLUE metrics over a task's splits, on one process or many.

Each rank predicts its contiguous slice of a split (``data.eval_loader``); the slices, gathered in
rank order, are the split in its own order, so every rank gets the metrics one process would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from nli import metrics
from nli.config import TaskConfig
from nli.device import Compute
from nli.distributed import World


@dataclass
class Evaluation:
    step: int
    metrics: Dict[str, float]  # GLUE names, with a suffix per extra split (accuracy_mm)
    objective: float  # the task's main metric on its main split

    def better_than(self, other: "Evaluation") -> bool:
        """Higher is better; an undefined score (NaN: a correlation of constant predictions)
        is worse than any number."""
        if math.isnan(other.objective):
            return not math.isnan(self.objective)
        return self.objective > other.objective


@dataclass
class Predictions:
    """A model's outputs on one split, in the split's order."""

    values: np.ndarray  # (examples,) label ids, or scores for a regression task
    labels: np.ndarray  # (examples,) the split's labels (-1 where it has none)
    idx: np.ndarray | None  # (examples,) the examples' numbers (or a test file's own ids, text), where kept (test)


@torch.no_grad()
def predict(model: torch.nn.Module, loader: DataLoader, task: TaskConfig, compute: Compute) -> Predictions:
    was_training = model.training
    model.eval()
    values: List[torch.Tensor] = []
    labels: List[torch.Tensor] = []
    idx: List[Any] = []
    for batch in loader:
        labels.append(batch.pop("labels"))
        if "idx" in batch:  # a tensor of numbers, or a list of text ids (data.TextIds)
            ids = batch.pop("idx")
            idx.extend(ids.tolist() if isinstance(ids, torch.Tensor) else ids)
        batch = {k: v.to(compute.device, non_blocking=True) for k, v in batch.items()}
        with compute.autocast():
            logits = model(**batch).logits  # (batch, num_labels)
        values.append(logits.float().squeeze(-1) if task.is_regression else logits.argmax(-1))
        compute.sync()  # XLA: one graph per batch shape, not one for the whole split
    model.train(was_training)
    return Predictions(values=torch.cat(values).cpu().numpy(), labels=torch.cat(labels).numpy(),
                       idx=np.asarray(idx) if idx else None)


def gather(predictions: Predictions, world: World) -> Predictions:
    """Every rank's predictions on its slice of a split, joined in rank order: the whole split."""
    parts = world.gather(predictions)
    if len(parts) == 1:
        return predictions
    return Predictions(values=np.concatenate([p.values for p in parts]),
                       labels=np.concatenate([p.labels for p in parts]),
                       idx=None if parts[0].idx is None else np.concatenate([p.idx for p in parts]))


def relabel(predictions: Predictions, label_map: Optional[np.ndarray]) -> Predictions:
    """Predictions of a model's label ids as the ids of a task's labels (``label_map[model id]``)."""
    if label_map is None:
        return predictions
    return Predictions(values=label_map[predictions.values], labels=predictions.labels, idx=predictions.idx)


@dataclass(frozen=True)
class Evaluator:
    """A task's metrics on its eval splits, for any model: the one training, the exported one, or a
    trained one whose labels are the task's by name (an MNLI model on HANS: ``label_map``)."""

    loaders: Mapping[str, DataLoader]  # eval split -> this rank's slice of it, in order
    task: TaskConfig
    compute: Compute
    world: World
    # eval split -> each of task.groups -> its value for each example of the split, in order
    groups: Mapping[str, Mapping[str, Sequence[str]]] = field(default_factory=dict)
    label_map: Optional[np.ndarray] = None  # model label id -> the task's label id; None: the same ids
    prefix: str = ""  # before every metric's name: an extra set's (hans/accuracy); "" for the run's task

    def __call__(self, model: torch.nn.Module, step: int) -> Evaluation:
        scores: Dict[str, float] = {}
        for split, loader in self.loaders.items():
            out = relabel(gather(predict(model, loader, self.task, self.compute), self.world), self.label_map)
            suffix = self.task.eval_splits[split]
            scores.update(metrics.compute(self.task.metrics, out.values, out.labels, suffix=suffix))
            scores.update(metrics.by_group(out.values, out.labels, self.groups.get(split, {}), self.task.label_names,
                                           suffix=suffix))
        objective = scores[self.task.main_metric + self.task.eval_splits[self.task.main_split]]
        return Evaluation(step=step, metrics={f"{self.prefix}{name}": value for name, value in scores.items()},
                          objective=objective)
