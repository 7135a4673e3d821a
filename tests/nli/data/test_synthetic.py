"""The synthetic NLI task (nli/data/synthetic.py): deterministic, balanced, its labels in the premise."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from typing import Dict

import pytest

from nli.config.schema import DataConfig
from nli.data import synthetic
from nli.errors import ConfigError

# generate(6000, seed=0, version=1), as the code before version 2 generated it (commit 26e74a1): the rows
# that runs started on version 1 go on with.
VERSION_1 = "0e762a2aa749e36851284840434c96b97faaddf708e0036851d2a461c86144e8"
PLACE = re.compile("|".join(synthetic.PLACES))


@pytest.mark.parametrize("version", sorted(synthetic.VERSIONS))
def test_synthetic_task_is_deterministic_and_balanced(version: int) -> None:
    a, b = synthetic.generate(3000, seed=0, version=version), synthetic.generate(3000, seed=0, version=version)
    assert a == b and synthetic.generate(10, seed=1, version=version) != synthetic.generate(10, seed=0, version=version)
    counts = Counter(a["label"])
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 900
    for premise, hypothesis, label in zip(a["premise"], a["hypothesis"], a["label"]):
        if synthetic.LABELS[label] == "entailment":  # entailments only repeat the premise's words
            assert set(hypothesis.split()) <= set(premise.split())


def test_the_config_takes_each_version_the_task_has_and_no_other() -> None:
    for version in synthetic.VERSIONS:
        assert DataConfig(synthetic_version=version).synthetic_version == version
    with pytest.raises(ConfigError, match="data.synthetic_version=3"):
        DataConfig(synthetic_version=max(synthetic.VERSIONS) + 1)


def test_version_1_generates_the_rows_it_always_did() -> None:
    rows = synthetic.generate(6000, seed=0, version=1)
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == VERSION_1


def read_both(premise: str, hypothesis: str) -> str:
    """Version 2's label as its docstring gives it: by the hypothesis, and where it says where, by the premise."""
    words = hypothesis.split()
    if "because" in words:
        return "neutral"
    if "not" in words or words[0] == "nobody":
        return "contradiction"
    said, given = PLACE.search(hypothesis), PLACE.search(premise)
    if said is None:
        return "entailment"
    if given is None:
        return "neutral"
    return "entailment" if said.group() == given.group() else "contradiction"


def shape(hypothesis: str) -> str:
    """A hypothesis less its words that say nothing of the label alone: who, what, the verb, where, why."""
    names = {*synthetic.SUBJECTS, *synthetic.OBJECTS, *(v for pair in synthetic.VERBS for v in pair)}
    text = " ".join("_" if word in names else word for word in hypothesis.split())
    for phrase in [*synthetic.PLACES, *synthetic.REASONS]:
        text = text.replace(phrase, "_")
    return text


def hypothesis_alone(rows: Dict[str, list]) -> float:
    """The accuracy of the best guess from each hypothesis's shape alone (each shape's most frequent label)."""
    by_shape: Dict[str, Counter] = defaultdict(Counter)
    for hypothesis, label in zip(rows["hypothesis"], rows["label"]):
        by_shape[shape(hypothesis)][label] += 1
    return sum(max(counts.values()) for counts in by_shape.values()) / len(rows["label"])


def test_version_2_labels_need_the_premise_and_follow_from_both_sentences() -> None:
    rows = synthetic.generate(6000, seed=0)
    for premise, hypothesis, label in zip(rows["premise"], rows["hypothesis"], rows["label"]):
        told = read_both(premise, hypothesis)
        assert told == synthetic.LABELS[label], (premise, hypothesis, synthetic.LABELS[label])
    assert 0.58 < hypothesis_alone(rows) < 0.62  # the docstring's 0.6
    # Version 1, where the hypothesis alone gave all but "another object" (the quickstart's 0.883 for any setting).
    assert hypothesis_alone(synthetic.generate(6000, seed=0, version=1)) > 0.88
