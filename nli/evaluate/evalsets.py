"""Evaluation sets: a task's eval splits (and test splits, to predict) for any trained model, and the
sets eval.extra adds (SNLI, ANLI's rounds, HANS, MNLI), each keyed by its name in the results.

Every set is a task of ``conf/task/``, loaded as that task loads (from the Hub, or from its original
download: ``eval.dir`` for the extra sets), without its training split, and tokenized by the model's
tokenizer. A model's predictions count as the set's labels by name (:func:`label_map`): an MNLI
model's entailment, neutral and contradiction are SNLI's and ANLI's own, and on HANS neutral and
contradiction both count as non-entailment. The model's own labels (its ``id2label``) are the truth.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from nli.config.schema import DataConfig, EvalConfig, TaskConfig, task_config
from nli.data import loaders as data
from nli.errors import ConfigError
from nli.evaluate.evaluation import Evaluation, Evaluator
from nli.evaluate.oom import Evaluations
from nli.model.build import GENERIC_LABEL  # transformers' names for labels nobody named
from nli.runtime.device import Compute
from nli.runtime.distributed import World

log = logging.getLogger(__name__)

# The label of a two-way set (HANS's non-entailment, RTE's not_entailment: one name here) that a
# three-way NLI model's neutral and contradiction both stand for.
NOT_ENTAILMENT = "non_entailment"
SYNONYMS = {"not_entailment": NOT_ENTAILMENT}
NOT_ENTAILED = frozenset({"neutral", "contradiction"})


@dataclass(frozen=True)
class EvalSet:
    """One set, ready to score a model: its metrics, and its test splits' loaders where it predicts."""

    evaluate: Evaluations  # in smaller batches where they run out of memory (nli.evaluate.oom)
    test: Dict[str, DataLoader]  # test split -> this rank's slice of it, in order (only when predicting)
    notes: Sequence[str] = ()  # what was asked and is not at hand (nli.data.loaders.Splits.notes): warnings


def extra_tasks(evaluation: EvalConfig) -> List[TaskConfig]:
    """The tasks of eval.extra (``anli``: its three rounds), in the order given."""
    return [task_config(name) for name in evaluation.tasks()]


def label_map(labels: Sequence[str], task: TaskConfig, *, model: str) -> Optional[np.ndarray]:
    """For each of a model's ``labels`` (its id2label, in id order; empty for a regression), the id of
    the label of ``task`` it counts as; None where those are the same ids. Names match case aside, ``-``
    and ``_`` alike; a two-way set's non-entailment takes neutral and contradiction. Labels that match
    nothing are a ConfigError, before anything is evaluated."""
    if task.is_regression != (not labels):
        raise ConfigError(f"{model} predicts {'labels' if labels else 'a score'}, and task {task.name} is a "
                          f"{'regression' if task.is_regression else 'classification'}: score it on a task of its kind")
    if task.is_regression:
        return None
    where = f"{model} predicts the labels {list(labels)}, and task {task.name} has the labels {task.label_names}"
    names = [_normal(name) for name in task.label_names]
    if all(GENERIC_LABEL.fullmatch(label) for label in labels):
        if len(labels) != len(names):
            raise ConfigError(f"{where}: unnamed labels (LABEL_0, ...) cannot be matched to them. Save the model "
                              "with id2label naming its labels")
        log.warning("%s: its unnamed labels are taken to be task %s's %s, in that order", model, task.name,
                    task.label_names)
        return None
    negative = [i for i, name in enumerate(names) if name == NOT_ENTAILMENT]  # a two-way set's non-entailment
    ids: List[int] = []
    unmatched: List[str] = []
    for label in labels:
        name = _normal(label)
        if name in names:
            ids.append(names.index(name))
        elif name in NOT_ENTAILED and negative:
            ids.append(negative[0])
        else:
            unmatched.append(label)
    if unmatched:
        raise ConfigError(f"{where}: {unmatched} match none of them by name (on a two-way set, neutral and "
                          "contradiction count as non-entailment). Evaluate a model trained on these labels, or "
                          "on labels they name (an NLI model's entailment, neutral and contradiction)")
    return None if ids == list(range(len(names))) else np.array(ids)


def _normal(name: str) -> str:
    name = name.strip().lower().replace("-", "_")
    return SYNONYMS.get(name, name)


@dataclass(frozen=True)
class Scoring:
    """What every set is read and scored with: the model's tokenizer and the collator, the model's labels
    (its id2label in id order; empty for a regression) and its name in messages, the device and
    processes, and the batches' size, loader workers and seed."""

    tokenizer: PreTrainedTokenizerBase
    collator: data.Collator
    labels: Sequence[str]
    model: str  # "model.name_or_path=...", "the model of task=rte"
    compute: Compute
    world: World
    batch_size: int  # train.eval_batch_size
    num_workers: int  # data.num_workers, as the device takes it
    seed: int


def prepare(task: TaskConfig, source: DataConfig, scoring: Scoring, *, prefix: str = "", predict: bool = False,
            dir_key: str = "data.dir") -> EvalSet:
    """``task``'s eval splits (and test splits, to ``predict``) from ``source``, tokenized, for ``scoring``'s
    model; metrics named ``<prefix><metric>``. The labels are matched before any data loads."""
    mapping = label_map(scoring.labels, task, model=scoring.model)
    splits = data.load_splits(task, source, seed=scoring.seed, predict=predict, train=False, dir_key=dir_key)
    examples = splits.eval  # as loaded, for the predictions files (nli.evaluate.per_class)
    return from_splits(task, data.tokenize(splits, scoring.tokenizer, task, source.max_seq_length), examples,
                       scoring, label_map=mapping, prefix=prefix)


def from_splits(task: TaskConfig, splits: data.Splits, examples: Dict[str, datasets.Dataset], scoring: Scoring, *,
                label_map: Optional[np.ndarray] = None, prefix: str = "") -> EvalSet:
    """The eval and test splits of ``splits`` (tokenized; ``examples``: the eval splits as loaded), in
    loaders of this rank's slice, and the evaluator of the eval splits."""
    loaders = {name: data.eval_loader(ds, scoring.collator, batch_size=scoring.batch_size, world=scoring.world,
                                      workers=data.Workers.on(scoring.compute.device.type, scoring.num_workers))
               for name, ds in {**splits.eval, **splits.test}.items()}
    evaluator = Evaluator({name: loaders[name] for name in splits.eval}, task, scoring.compute, scoring.world,
                          groups=splits.groups, label_map=label_map, prefix=prefix, examples=examples)
    return EvalSet(Evaluations(evaluator), {name: loaders[name] for name in splits.test}, splits.notes)


def extras(evaluation: EvalConfig, run_data: DataConfig, scoring: Scoring) -> List[Evaluations]:
    """The sets of eval.extra, from ``eval.dir`` (their original downloads) or the Hub, each keyed
    ``<task>/<metric>`` (hans/accuracy, anli_r1/accuracy_test), cut and tokenized as the run's own data
    (``run_data``). Every set's labels are matched to the model's first: a mismatch stops the run before
    any set loads."""
    tasks = extra_tasks(evaluation)
    for task in tasks:
        label_map(scoring.labels, task, model=scoring.model)
    source = dataclasses.replace(run_data, dir=evaluation.dir, files={}, columns={})
    return [prepare(task, source, scoring, prefix=f"{task.name}/", dir_key="eval.dir").evaluate for task in tasks]


def evaluations(evaluators: Sequence[Evaluations], model: torch.nn.Module, step: int) -> List[Evaluation]:
    """Every set's evaluation of ``model``, in order."""
    return [evaluate(model, step) for evaluate in evaluators]


def scores(evaluated: Sequence[Evaluation]) -> Dict[str, float]:
    """Every set's metrics, keyed by set."""
    return {name: value for evaluation in evaluated for name, value in evaluation.metrics.items()}
