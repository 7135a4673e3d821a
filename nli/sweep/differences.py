"""Whether two settings of a sweep are told apart: the difference of their objectives' means over seeds,
with a 95% bootstrap interval and a permutation test.

Two or three seeds are what a researcher can afford, and fine-tuning's seed variance is as large as the
differences looked for (Dodge et al. 2020; Mosbach et al. 2021): a mean ± sd per setting cannot say
whether one beats another. For every two settings that differ in one swept value (the others alike), B's
mean minus A's, where:

- the interval is the 2.5th to 97.5th percentile of that difference over 10,000 bootstrap resamples
  (scipy.stats.bootstrap, ``method="percentile"``), of the seeds both ran, as pairs, where both ran the
  same seeds (a seed is the same data order and initialisation on both sides), else of each side's seeds
  apart;
- the p-value is a two-sided permutation test of the same difference (scipy.stats.permutation_test):
  each pair's two values swapped (paired), else the values shuffled between the sides; exact where the
  arrangements are few. With n paired seeds its smallest possible value is 2 / 2**n (0.25 for 3 seeds);
- a pair whose interval holds 0 is *not told apart*; one whose interval leaves 0 out is *told apart*
  where the test agrees (p < 0.05), else *interval only*: too few seeds for the test to say so (a 95%
  interval over three seeds is narrower than it should be); with one seed on a side there is no interval.

The resamples are drawn from a fixed seed, so the same table gives the same figures every time.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE  # the test's level, as the interval's
RESAMPLES = 10_000
RANDOM_SEED = 0  # of the resamples and permutations: the same figures each time
BATCH = 250  # resamples drawn at once: MNLI's 9,815 examples resampled 10,000 times at once would take 785 MB

Setting = Tuple[Tuple[str, str], ...]  # the swept values other than the seed, as (key, value), in one key order
ByUnit = Mapping[str, float]  # a setting's objective on each of its seeds (seed -> value)


@dataclass(frozen=True)
class Difference:
    """B's mean minus A's, with its uncertainty."""

    mean: float
    low: float  # the 95% bootstrap interval's ends; NaN where a side has one value (no interval)
    high: float
    p_value: float  # two-sided permutation test; NaN where a side has one value
    paired: bool  # resampled as pairs (both sides ran the same seeds), else each side apart
    n_a: int  # values on each side
    n_b: int
    no_interval: str = "one seed: no interval"  # the verdict where there is no interval, and why

    @property
    def told_apart(self) -> Optional[bool]:
        """Whether the interval leaves 0 out; None where there is no interval."""
        if math.isnan(self.low):
            return None
        return not self.low <= 0.0 <= self.high


def between(a: ByUnit, b: ByUnit) -> Difference:
    """The difference of the means of ``b`` and ``a``, each a setting's objective by seed."""
    paired = sorted(a) == sorted(b) and len(a) > 1
    if paired:
        seeds = sorted(a)
        xs, ys = np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds])
    else:
        xs, ys = np.array(list(a.values())), np.array(list(b.values()))
    mean = float(np.mean(ys) - np.mean(xs))
    if min(len(xs), len(ys)) < 2:
        return Difference(mean, math.nan, math.nan, math.nan, paired=False, n_a=len(xs), n_b=len(ys))
    from scipy import stats  # 1.4 s to import: only where a difference is computed (the sweep's callback imports this)

    statistic = _mean_of_differences if paired else _difference_of_means
    low, high = interval((ys, xs), statistic, paired=paired)
    test = stats.permutation_test((ys, xs), statistic, permutation_type="samples" if paired else "independent",
                                  vectorized=True, n_resamples=RESAMPLES, rng=np.random.default_rng(RANDOM_SEED))
    return Difference(mean, low, high, float(test.pvalue), paired=paired, n_a=len(xs), n_b=len(ys))


def interval(data: Tuple[np.ndarray, ...], statistic: Callable[..., Any], *, paired: bool,
             vectorized: bool = True, resamples: int = RESAMPLES) -> Tuple[float, float]:
    """The 95% percentile bootstrap interval of ``statistic`` over ``data``; one value each end where every
    resample gives the same (the same run twice: [0, 0])."""
    from scipy import stats

    with warnings.catch_warnings():  # a statistic NaN on some resamples: no interval (NaN), said by the caller
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        found = stats.bootstrap(data, statistic, paired=paired, vectorized=vectorized, method="percentile",
                                confidence_level=CONFIDENCE, n_resamples=resamples, batch=BATCH,
                                rng=np.random.default_rng(RANDOM_SEED))
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def _mean_of_differences(y: np.ndarray, x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(y - x, axis=axis)


def _difference_of_means(y: np.ndarray, x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(y, axis=axis) - np.mean(x, axis=axis)


@dataclass(frozen=True)
class Pair:
    """Two settings that differ in one swept value, and the difference of their objectives (B - A)."""

    key: str  # the swept value they differ in
    a: str  # its value in each
    b: str
    fixed: Setting  # the other swept values, alike in both
    difference: Difference


def pairs(settings: Mapping[Setting, ByUnit]) -> List[Pair]:
    """Every two ``settings`` that differ in exactly one value, in the order given (A the earlier)."""
    found: List[Pair] = []
    for first, second in combinations(settings, 2):
        a, b = dict(first), dict(second)
        differ = [key for key in a if a[key] != b.get(key)]
        if len(differ) == 1 and a.keys() == b.keys():
            key = differ[0]
            fixed = tuple((k, v) for k, v in first if k != key)
            found.append(Pair(key, a[key], b[key], fixed, between(settings[first], settings[second])))
    return found


def verdict(difference: Difference) -> str:
    """What a reader takes from the interval and, where there is one, the test: with three seeds a bootstrap
    interval can leave 0 out (every seed's difference of one sign) while no permutation test can say so
    (its p is at least 0.25), and the verdict says that too."""
    if difference.told_apart is None:
        return difference.no_interval
    if not difference.told_apart:
        return "not told apart"
    # No test (NaN: a difference over examples, nli.sweep.compare): the interval decides alone.
    return "told apart" if not difference.p_value >= ALPHA else f"interval only: p ≥ {ALPHA:g}"


def cells(pair: Pair) -> List[object]:
    """A pair's line of a table (:data:`HEADER`): the swept value and its two values, the others, n, the
    difference, its interval, p and the verdict."""
    d = pair.difference
    n = f"{d.n_a} pairs" if d.paired else f"{d.n_a} / {d.n_b}"
    span = "" if math.isnan(d.low) else f"[{d.low:+.4f}, {d.high:+.4f}]"
    p_value = "" if math.isnan(d.p_value) else f"{d.p_value:.3g}"
    others = ", ".join(f"{key}={value}" for key, value in pair.fixed)
    return [pair.key, pair.a, pair.b, others, n, f"{d.mean:+.4f}", span, p_value, verdict(d)]


HEADER = ["setting", "A", "B", "others alike", "n", "B - A", "95% interval", "p", "verdict"]


def records(found: Sequence[Pair]) -> List[dict]:
    """The pairs as flat rows, for a CSV: every figure, unrounded."""
    return [{"setting": pair.key, "a": pair.a, "b": pair.b, **dict(pair.fixed), "n_a": pair.difference.n_a,
             "n_b": pair.difference.n_b, "paired": pair.difference.paired, "difference": pair.difference.mean,
             "interval_low": pair.difference.low, "interval_high": pair.difference.high,
             "p_value": pair.difference.p_value, "verdict": verdict(pair.difference)} for pair in found]


EXPLAINED = ("B - A: the difference of the objective's means over seeds; 95% interval: percentile bootstrap over "
             f"the seeds ({RESAMPLES:,} resamples), as pairs where both ran the same seeds; p: two-sided "
             "permutation test (with n paired seeds never below 2/2^n); not told apart: the interval holds 0; interval "
             "only: it leaves 0 out but p ≥ 0.05 (too few seeds for the test)")
