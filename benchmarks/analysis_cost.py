"""What a run's error analysis adds to its end (nli.evaluate.per_class): each class's precision, recall and F1,
the confusion matrix and the predictions file, for MNLI's two dev sets (9,815 and 9,832 pairs), and
the evaluation loss and class probabilities taken from the logits (nli.evaluate.evaluation, nli.evaluate.metrics).

    python -m benchmarks.analysis_cost

Predictions of the real size with random logits, and pairs of the sentence lengths of MNLI's (a premise
of about 22 words, a hypothesis of about 11); prints each part's seconds, best of three, and its time
per example. Compare it with a run's evaluation: ``eval_examples_per_second`` in results.json (the
benchmark ``vs_trainer`` prints it) is the model's side of the same examples.
"""

from __future__ import annotations

import json
import time
from typing import Callable, Dict

import datasets
import numpy as np
import torch

from nli.config.command import compose
from nli.config.schema import TaskConfig
from nli.evaluate import metrics, per_class
from nli.evaluate.evaluation import Predictions

SPLITS = {"validation_matched": 9815, "validation_mismatched": 9832}
WORDS = np.array("a man woman child dog runs sits walks in on the park street house red blue old young".split())


def _pairs(size: int, rng: np.random.Generator) -> datasets.Dataset:
    def sentence(words: int) -> str:
        return " ".join(rng.choice(WORDS, size=max(3, int(rng.normal(words, words / 3)))))

    return datasets.Dataset.from_dict({"premise": [sentence(22) for _ in range(size)],
                                       "hypothesis": [sentence(11) for _ in range(size)],
                                       "label": rng.integers(0, 3, size).tolist(), "idx": list(range(size))})


def _best_of_three(work: Callable[[], object]) -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def _split_seconds(task: TaskConfig, size: int, rng: np.random.Generator) -> Dict[str, float]:
    """Each part's seconds on one split of ``size`` examples."""
    logits = torch.from_numpy(rng.normal(size=(size, 3)).astype(np.float32))
    labels = rng.integers(0, 3, size)
    pairs = _pairs(size, rng)
    made = Predictions(values=logits.argmax(-1).numpy(), labels=labels, idx=np.arange(size),
                       log_probs=torch.log_softmax(logits, dim=-1).numpy())
    parts: Dict[str, Callable[[], object]] = {
        "probabilities and loss": lambda: metrics.loss(labels, scores=made.values,
                                                       log_probs=torch.log_softmax(logits, dim=-1).numpy()),
        "per-class figures": lambda: per_class.per_class(made, task.label_names),
        "confusion matrix": lambda: per_class.confusion(made, task.label_names),
        "predictions file": lambda: "".join(json.dumps(row, ensure_ascii=False) + "\n"  # as per_class.files
                                            for row in per_class.rows(task, made, pairs)),
    }
    return {name: _best_of_three(work) for name, work in parts.items()}


def main() -> None:
    task = compose(["task=mnli"]).task
    rng = np.random.default_rng(0)
    total: Dict[str, float] = {}
    for size in SPLITS.values():
        for name, seconds in _split_seconds(task, size, rng).items():
            total[name] = total.get(name, 0.0) + seconds
    examples = sum(SPLITS.values())
    print(f"MNLI's two dev sets, {examples:,} pairs:")
    for name, seconds in total.items():
        print(f"  {name:<24} {seconds:7.3f} s  {seconds / examples * 1e6:6.1f} µs per example")
    everything = sum(total.values())
    print(f"  {'all of it':<24} {everything:7.3f} s  {everything / examples * 1e6:6.1f} µs per example")


if __name__ == "__main__":
    main()
