"""The synthetic NLI task (nli/data/synthetic.py): deterministic, balanced, learnable."""

from __future__ import annotations

from collections import Counter

from nli.data import synthetic


def test_synthetic_task_is_deterministic_and_balanced() -> None:
    a, b = synthetic.generate(3000, seed=0), synthetic.generate(3000, seed=0)
    assert a == b and synthetic.generate(10, seed=1) != synthetic.generate(10, seed=0)
    counts = Counter(a["label"])
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 900
    # Contradictions negate; entailments only repeat the premise's words.
    for premise, hypothesis, label in zip(a["premise"], a["hypothesis"], a["label"]):
        if synthetic.LABELS[label] == "entailment":
            assert set(hypothesis.split()) <= set(premise.split())
        if synthetic.LABELS[label] == "contradiction":
            assert {"not", "nobody"} & set(hypothesis.split())
