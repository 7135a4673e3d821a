"""The differences between settings (nli/sweep/differences.py) against answers worked out by hand: the same
results twice, results built to differ, an exact permutation count, and which settings are paired."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nli.sweep import differences
from nli.sweep.differences import between, pairs, verdict

SEEDS = ("1", "2", "3", "4")


def by_seed(*values: float) -> dict:
    return dict(zip(SEEDS, values))


def test_the_same_results_twice_have_an_interval_of_0_and_are_not_told_apart() -> None:
    same = by_seed(0.61, 0.64, 0.58, 0.66)
    found = between(same, dict(same))
    assert found.paired and found.mean == 0.0
    assert (found.low, found.high) == (0.0, 0.0)  # every resample of four zero differences is 0
    assert found.p_value == 1.0 and found.told_apart is False and verdict(found) == "not told apart"


def test_results_built_to_differ_are_told_apart_by_their_seeds_as_pairs() -> None:
    """B beats A by 0.05 on every seed, on top of a seed variance of 0.08: paired, the interval is the shift
    alone; unpaired, it would hold 0. With four pairs the exact sign-flip test's p is 2 / 2**4."""
    a = by_seed(0.60, 0.68, 0.56, 0.64)
    b = {seed: value + 0.05 for seed, value in a.items()}
    found = between(a, b)
    assert found.paired and found.mean == pytest.approx(0.05)
    assert found.low == pytest.approx(0.05) and found.high == pytest.approx(0.05)
    assert found.p_value == pytest.approx(2 / 2 ** 4)  # only all four signs flipped gives as large a mean
    # The interval leaves 0 out; the exact test cannot go below 0.125 with four seeds, and the verdict says so.
    assert found.told_apart is True and verdict(found) == "interval only: p ≥ 0.05"
    six = {str(seed): 0.6 + 0.02 * (seed % 3) for seed in range(6)}
    found = between(six, {seed: value + 0.05 for seed, value in six.items()})
    assert found.p_value == pytest.approx(2 / 2 ** 6) and verdict(found) == "told apart"


def test_settings_without_the_same_seeds_are_compared_apart() -> None:
    """Seeds 1-3 against 4-6: no pairs. Of the 20 ways to split the six values three and three, only the two
    extremes give a difference of means as large as |5 - 2| = 3: p = 2/20."""
    found = between({"1": 1.0, "2": 2.0, "3": 3.0}, {"4": 4.0, "5": 5.0, "6": 6.0})
    assert not found.paired and (found.n_a, found.n_b) == (3, 3) and found.mean == 3.0
    assert found.p_value == pytest.approx(0.1)
    assert 0 < found.low <= 3.0 <= found.high  # resampling each side apart: every resample of B is above A's
    assert found.told_apart is True and verdict(found) == "interval only: p ≥ 0.05"


def test_one_seed_on_a_side_has_no_interval() -> None:
    found = between({"1": 0.5}, by_seed(0.6, 0.7))
    assert math.isnan(found.low) and math.isnan(found.p_value) and found.mean == pytest.approx(0.15)
    assert found.told_apart is None and verdict(found) == "one seed: no interval"


def test_the_interval_is_scipys_percentile_bootstrap_of_the_paired_differences() -> None:
    """The interval is the 2.5th and 97.5th percentile of the mean difference over resamples of the seeds:
    drawn here again by hand with NumPy, it lands within a resample's step of SciPy's."""
    rng = np.random.default_rng(7)
    a = by_seed(*rng.normal(0.7, 0.02, 4))
    b = {seed: value + rng.normal(0.01, 0.02) for seed, value in a.items()}
    found = between(a, b)
    diffs = np.array([b[s] - a[s] for s in SEEDS])
    means = diffs[np.random.default_rng(1).integers(0, 4, (100_000, 4))].mean(axis=1)
    assert found.low == pytest.approx(np.percentile(means, 2.5), abs=2e-3)
    assert found.high == pytest.approx(np.percentile(means, 97.5), abs=2e-3)


def test_pairs_are_the_settings_that_differ_in_one_value() -> None:
    """A 2 x 2 grid of learning rate and warmup: four pairs, the two diagonals left out."""
    grid = {(("lr", lr), ("warmup", w)): by_seed(float(i), float(i) + 0.1)
            for i, (lr, w) in enumerate([("1e-5", "0"), ("1e-5", "0.1"), ("2e-5", "0"), ("2e-5", "0.1")])}
    found = pairs(grid)
    assert [(p.key, p.a, p.b, p.fixed) for p in found] == [
        ("warmup", "0", "0.1", (("lr", "1e-5"),)),
        ("lr", "1e-5", "2e-5", (("warmup", "0"),)),
        ("lr", "1e-5", "2e-5", (("warmup", "0.1"),)),
        ("warmup", "0", "0.1", (("lr", "2e-5"),)),
    ]
    assert [p.difference.mean for p in found] == pytest.approx([1.0, 2.0, 2.0, 1.0])
    line = dict(zip(differences.HEADER, differences.cells(found[1])))
    assert line["others alike"] == "warmup=0" and line["n"] == "2 pairs" and line["B - A"] == "+2.0000"
    assert line["95% interval"] == "[+2.0000, +2.0000]" and line["p"] == "0.5"
    assert line["verdict"] == "interval only: p ≥ 0.05"
