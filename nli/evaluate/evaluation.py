"""A model's predictions and GLUE metrics over a task's splits, on one process or many.

Each rank predicts its contiguous slice of a split (``data.eval_loader``), in batches of about one
length (far less padding), and puts its predictions back in the slice's order; the slices, gathered
in rank order, are the split in its own order, so every rank gets the metrics one process would.
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Mapping, Optional, Sequence

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader

from nli.config.schema import TaskConfig
from nli.data import loaders as data
from nli.evaluate import calibration, metrics
from nli.runtime.device import Compute
from nli.runtime.distributed import World


@dataclass
class Evaluation:
    step: int
    metrics: Dict[str, float]  # GLUE names, with a suffix per extra split (accuracy_mm)
    objective: float  # the task's main metric on its main split

    def __post_init__(self) -> None:
        # Each eval split's predictions (whole and relabelled), where this evaluation made them: the run's
        # final evaluation writes them (nli.evaluate.per_class). Not a field: asdict(), which checkpoints, export.json
        # and the best evaluation's state hold, leaves them out; an evaluation read back from those has none.
        self.predictions: Dict[str, Predictions] = {}

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
    # (examples, classes) each class's log-probability (log-softmax of the logits, float32); None for a regression
    log_probs: np.ndarray | None = None
    # (examples, the model's classes) the model's own log_probs, where :func:`relabel` summed them into a task's
    # labels: a temperature divides these (nli.evaluate.reliability); None where they are log_probs
    own_log_probs: np.ndarray | None = None

    @property
    def probabilities(self) -> np.ndarray | None:
        """(examples, classes) each class's probability (softmax); None for a regression."""
        return None if self.log_probs is None else np.exp(self.log_probs)


# Each eval loader's examples predicted and the seconds that took, in this process, for as long as it lives.
_SPEED: "weakref.WeakKeyDictionary[DataLoader, List[Any]]" = weakref.WeakKeyDictionary()


def examples_per_second(loaders: Iterable[DataLoader], world: World) -> Optional[float]:
    """How fast the model predicted the examples of ``loaders`` (this rank's slices), over every
    prediction so far, for the whole world (a rank's slice times the ranks: slices differ by one
    example at most); None before any."""
    examples, seconds = 0, 0.0
    for loader in loaders:
        done, took = _SPEED.get(loader, (0, 0.0))
        examples, seconds = examples + done, seconds + took
    return examples * world.world_size / seconds if seconds > 0 else None


@torch.no_grad()
def predict(model: torch.nn.Module, loader: DataLoader, task: TaskConfig, compute: Compute) -> Predictions:
    """The model's predictions on ``loader``'s examples, in their own order (a loader that batches them by
    length, nli.data.loaders.LengthGroups, has them put back), its speed kept for :func:`examples_per_second`."""
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    outputs: List[torch.Tensor] = []
    labels: List[torch.Tensor] = []
    idx: List[Any] = []
    # A regression's prediction is the model's output itself, not an argmax of it: under bf16 autocast it would be
    # rounded to 8 significant bits (steps of 1/32 between 4 and 5 on STS-B's scale), tying pairs the model tells
    # apart in its correlations and writing those steps to the predictions and the submission. Computed in fp32,
    # as the exported model computes it under from_pretrained and pipeline.
    precision: Callable[[], ContextManager[Any]] = contextlib.nullcontext if task.is_regression else compute.autocast
    for batch in loader:
        labels.append(batch.pop("labels"))
        if "idx" in batch:  # a tensor of numbers, or a list of text ids (data.TextIds)
            ids = batch.pop("idx")
            idx.extend(ids.tolist() if isinstance(ids, torch.Tensor) else ids)
        batch = {k: v.to(compute.device, non_blocking=True) for k, v in batch.items()}
        with precision():
            logits = model(**batch).logits  # (batch, num_labels)
        outputs.append(logits.float())  # exact: argmax of these is that of the autocast dtype's logits
        compute.sync()  # XLA: one graph per batch shape, not one for the whole split
    model.train(was_training)
    if not outputs:  # this rank's slice of a split smaller than the ranks: its part of the whole is empty
        outputs = [torch.empty(0, getattr(model.config, "num_labels", task.num_labels))]
        labels = [torch.empty(0, dtype=torch.float32 if task.is_regression else torch.int64)]
    logits = torch.cat(outputs).cpu()
    values = logits.squeeze(-1) if task.is_regression else logits.argmax(-1)
    log_probs = None if task.is_regression else torch.log_softmax(logits, dim=-1).numpy()
    predictions = data.in_split_order(loader, Predictions(values=values.numpy(), labels=torch.cat(labels).numpy(),
                                                          idx=np.asarray(idx) if idx else None, log_probs=log_probs))
    speed = _SPEED.setdefault(loader, [0, 0.0])
    speed[0] += len(predictions.values)
    speed[1] += time.perf_counter() - started
    return predictions


def gather(predictions: Predictions, world: World) -> Predictions:
    """Every rank's predictions on its slice of a split, joined in rank order: the whole split."""
    parts = world.gather(predictions)
    if len(parts) == 1:
        return predictions
    return Predictions(values=np.concatenate([p.values for p in parts]),
                       labels=np.concatenate([p.labels for p in parts]),
                       idx=None if parts[0].idx is None else np.concatenate([p.idx for p in parts]),
                       log_probs=None if parts[0].log_probs is None else np.concatenate([p.log_probs for p in parts]))


def relabel(predictions: Predictions, label_map: Optional[np.ndarray], classes: Optional[int] = None) -> Predictions:
    """Predictions of a model's label ids as the ids of a task's ``classes`` labels (``label_map[model id]``;
    default: as many as the map reaches); each task label's probability is the sum of those of the model's
    labels that count as it (HANS's non-entailment: neutral's and contradiction's), 0 where none does. The
    prediction stays the model's most probable label, as it counts."""
    if label_map is None:
        return predictions
    log_probs = None
    if predictions.log_probs is not None:
        model_log_probs = predictions.log_probs
        columns = [model_log_probs[:, label_map == j] for j in range(classes or int(label_map.max()) + 1)]
        log_probs = np.stack([np.logaddexp.reduce(column, axis=1) if column.shape[1]
                              else np.full(len(column), -np.inf) for column in columns], axis=1).astype(np.float32)
    return Predictions(values=label_map[predictions.values], labels=predictions.labels, idx=predictions.idx,
                       log_probs=log_probs, own_log_probs=predictions.log_probs)


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
    # eval split -> its examples as loaded, before tokenizing (text fields, label, idx), in order: the rows
    # of its predictions file (nli.evaluate.per_class)
    examples: Mapping[str, datasets.Dataset] = field(default_factory=dict)
    # The evaluations it made in this process, while something holds them (:meth:`made`).
    _made: "weakref.WeakValueDictionary[int, Evaluation]" = field(
        default_factory=weakref.WeakValueDictionary, init=False, repr=False, compare=False)

    def __call__(self, model: torch.nn.Module, step: int) -> Evaluation:
        scores: Dict[str, float] = {}
        outputs: Dict[str, Predictions] = {}
        for split, loader in self.loaders.items():
            out = relabel(gather(predict(model, loader, self.task, self.compute), self.world), self.label_map,
                          len(self.task.label_names))
            outputs[split] = out
            suffix = self.task.eval_splits[split]
            scores.update(metrics.compute(self.task.metrics, out.values, out.labels, suffix=suffix))
            scores.update(metrics.by_group(out.values, out.labels, self.groups.get(split, {}), self.task.label_names,
                                           suffix=suffix))
            scores[f"loss{suffix}"] = metrics.loss(out.labels, scores=out.values, log_probs=out.log_probs)
            scores.update(calibration.scores(out.probabilities, out.values, out.labels, suffix=suffix))
        objective = scores[self.task.main_metric + self.task.eval_splits[self.task.main_split]]
        evaluation = Evaluation(step=step, metrics={f"{self.prefix}{name}": value for name, value in scores.items()},
                                objective=objective)
        evaluation.predictions = outputs
        self._made[id(evaluation)] = evaluation
        return evaluation

    def made(self, evaluation: Optional[Evaluation]) -> bool:
        """Whether ``evaluation`` is one this evaluator made in this process (an earlier attempt's,
        read from a checkpoint, is not)."""
        return evaluation is not None and self._made.get(id(evaluation)) is evaluation

    def examples_per_second(self) -> Optional[float]:
        """How fast its evaluations so far predicted (:func:`examples_per_second`); None before any."""
        return examples_per_second(self.loaders.values(), self.world)
