"""``python -m nli.report compare RUN_A RUN_B``: two runs told apart, or not, on the same eval examples.

Each run's final evaluation (of its best checkpoint) wrote every eval example's prediction
(``eval_predictions/<split>.jsonl``, nli.evaluate.per_class). Two runs evaluated on a split predicted the
same examples, so their difference is judged example by example, far more tightly than over seeds:

- each of the task's metrics on both runs, and B's minus A's with a 95% paired bootstrap interval over
  the examples (the same resampled examples for both runs; 2,000 resamples, percentile interval);
- for a classification, McNemar's exact test: of the examples that one run gets right and the other
  wrong, whether each run is as likely to be that one (the two-sided binomial test of the two counts,
  scipy.stats.binomtest, as statsmodels' ``mcnemar(exact=True)`` computes it).

Every split both runs predicted is compared (``--split`` picks some), each run's own task and, for
eval.extra's sets (``hans/validation``), that set's. Runs that did not predict the same examples (another
``data.max_eval_samples``, another task) are refused, saying which.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nli.config.schema import TaskConfig, task_config
from nli.contract import CONFIG_FILE, RESULTS_FILE
from nli.contract import EVAL_PREDICTIONS_DIR as FOLDER
from nli.errors import UserError
from nli.evaluate.metrics import METRICS
from nli.io.claim import live_holder
from nli.io.storage import Storage
from nli.sweep import differences
from nli.sweep import table as sweep

RESAMPLES = 2_000  # of the examples: each resample computes every metric on both runs
SUFFIX = ".jsonl"


class CompareError(UserError):
    """Two runs that cannot be compared: no predictions, or not of the same examples."""


@dataclass(frozen=True)
class Split:
    """One run's predictions on one eval split, in the split's order, labelled examples only."""

    idx: np.ndarray  # the examples' numbers in their source
    labels: np.ndarray  # gold label ids (a score for a regression)
    predictions: np.ndarray  # predicted label ids (a score for a regression)


@dataclass(frozen=True)
class MetricDifference:
    metric: str
    a: float
    b: float
    difference: differences.Difference  # over examples: the paired bootstrap's interval; no p-value


@dataclass(frozen=True)
class McNemar:
    both: int  # right in both runs
    only_a: int  # right in A only
    only_b: int
    neither: int
    p_value: float  # exact (binomial) two-sided


@dataclass(frozen=True)
class Comparison:
    split: str
    examples: int
    metrics: List[MetricDifference]
    mcnemar: Optional[McNemar]  # None for a regression


def compare_runs(run_a: str, run_b: str, splits: Sequence[str] = ()) -> List[Comparison]:
    """Each split both runs predicted (or those of ``splits``), compared."""
    a, b = Storage(run_a, key="RUN_A"), Storage(run_b, key="RUN_B")
    if a.absolute() == b.absolute():  # a tab completed to the same run: a table of no difference, and no error
        raise CompareError(f"RUN_B {run_b} is RUN_A's folder again ({a.absolute()}): give the folders of two runs")
    for run in (a, b):  # said alone: what the other run predicted does not help
        if (unusable := _unusable(run)) is not None:
            raise CompareError(unusable)
    common = [split for split in predicted(a) if split in predicted(b)]
    if not common:
        raise CompareError(f"{run_a} and {run_b} share no eval split's predictions ({run_a} predicted "
                           f"{', '.join(predicted(a))}; {run_b} predicted {', '.join(predicted(b))})")
    asked = list(dict.fromkeys(splits))  # a split given twice is compared once, not printed twice
    for split in asked:
        if split not in common:
            raise CompareError(f"--split {split}: not a split both runs predicted; they share {', '.join(common)}")
    configs = _config(a), _config(b)
    task_a, task_b = (_task(config, run) for config, run in zip(configs, (a, b)))
    other = _other_examples(*configs)
    return [compare_split(split, task_of(task_a, split), task_of(task_b, split), read(a, split), read(b, split),
                          other) for split in (asked or common)]


def predicted(run: Storage) -> List[str]:
    """The splits whose predictions the run wrote, by key (``validation``, ``hans/validation``)."""
    root = run.path(FOLDER)
    if not run.fs.isdir(root):
        return []
    return sorted(path[len(root) + 1:-len(SUFFIX)] for path in run.fs.find(root) if path.endswith(SUFFIX))


def _unusable(run: Storage) -> Optional[str]:
    """Why a folder has no predictions to compare; None where it has. A run writes them at its end, with its
    results.json: one still going (its config.yaml not yet written, as it starts), stopped or failed is told so, not
    sent to predict again with eval.only what it has not finished training."""
    if predicted(run) and run.exists(CONFIG_FILE):
        return None
    if (holder := live_holder(run)) is not None:
        return f"a run is still going in {run.url} ({holder}): it writes {FOLDER}/ at its end; compare it then"
    if not run.exists(CONFIG_FILE):
        return _not_a_run(run)
    if not run.exists(RESULTS_FILE):
        return (f"{run.url} has not ended (no {RESULTS_FILE}): it was stopped, or failed, before its final evaluation "
                f"wrote {FOLDER}/; the same command again continues a stopped run, and its train.log says why one "
                "failed")
    return (f"{run.url} has no {FOLDER}/: it ran with eval.save_predictions=false, or before predictions were "
            f"kept; python train.py eval.only=true model.name_or_path={run.url} writes them into a folder of its own")


def _not_a_run(run: Storage) -> str:
    """What a folder without config.yaml is: none (a path mistyped), a sweep directory (its jobs' folders are the
    runs), or another folder."""
    expected = f"give a run's output folder (the one holding {CONFIG_FILE} and {FOLDER}/)"
    if not run.check_readable():
        return f"{run.url}: no such folder; {expected}"
    if run.exists(sweep.RESULTS_JSONL):
        jobs = [run.describe(name) for name in run.list("") if run.exists(f"{name}/{CONFIG_FILE}")]
        return f"{run.url} is a sweep directory, not a run: give two of its jobs' folders ({', '.join(jobs[:2])}, ...)"
    return f"{run.url} is not a run folder (no {CONFIG_FILE}): {expected}"


def _config(run: Storage) -> Dict[str, Any]:
    """The run's config.yaml; one damaged or replaced (no task in it) refused, saying so and what to do."""
    try:
        config = yaml.safe_load(run.read_bytes(CONFIG_FILE))
    except OSError as err:
        raise CompareError(f"{run.describe(CONFIG_FILE)} cannot be read ({err})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise CompareError(f"{run.describe(CONFIG_FILE)} is not valid YAML{where}: changed since the run wrote "
                           "it; restore it, or compare another run") from None
    if not isinstance(config, dict) or not isinstance(config.get("task"), dict):
        raise CompareError(f"{run.describe(CONFIG_FILE)} holds no task: not the config a run writes (emptied or "
                           "replaced since); restore it, or compare another run")
    return config


def _task(config: Dict[str, Any], run: Storage) -> TaskConfig:
    """The task of the run's ``config``."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TaskConfig), config["task"])
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as err:  # a task of another version's keys, or a value its key does not take
        raise CompareError(f"{run.describe(CONFIG_FILE)}: the run's task cannot be read "
                           f"({str(err).splitlines()[0]})") from None


def _other_examples(config_a: Dict[str, Any], config_b: Dict[str, Any]) -> str:
    """The settings that choose a split's examples (sweep.OTHER_EXAMPLES) where the runs' configs differ, as
    ``data.synthetic_eval_size=1000 and 96``: what makes two runs predict other examples, and what to make the same."""
    configs = [OmegaConf.create(config) for config in (config_a, config_b)]
    values = {key: [OmegaConf.select(config, key) for config in configs] for key in sweep.OTHER_EXAMPLES
              if key != "task"}
    return "; ".join(f"{key}={_typed(x)} and {_typed(y)}" for key, (x, y) in values.items() if x != y)


def _typed(value: Any) -> str:
    """A value as the command line types it (null, not None)."""
    return "null" if value is None else str(value)


def task_of(task: TaskConfig, split: str) -> TaskConfig:
    """The task a split's predictions are of: an eval.extra set's (``hans/validation``: hans), else the run's."""
    extra, _, _ = split.rpartition("/")
    return task_config(extra) if extra else task


def read(run: Storage, split: str) -> Split:
    """A run's predictions file on ``split``; the examples without a gold label left out."""
    name = f"{FOLDER}/{split}{SUFFIX}"
    try:
        text = run.read_bytes(name).decode()
    except OSError as err:
        raise CompareError(f"{run.describe(name)} cannot be read ({err})") from None
    lines = [_line(line, f"{run.describe(name)}, line {number}", run.url)
             for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    lines = [line for line in lines if line.get("label") is not None]
    _whole(run, split, len(lines))
    regression = bool(lines) and isinstance(lines[0]["label"], (int, float))
    if regression:
        return Split(_column(lines, "idx"), _column(lines, "label", float), _column(lines, "prediction", float))
    labels = {name: i for i, name in enumerate(_labels(lines))}
    return Split(_column(lines, "idx"), np.array([labels[line["label"]] for line in lines]),
                 np.array([labels[line["prediction"]] for line in lines]))


def _whole(run: Storage, split: str, labelled: int) -> None:
    """Refuse a predictions file with another number of labelled examples than the run scored on ``split``
    (results.json's per-class support): a copy cut short between two lines, or emptied, read as a run of other
    examples, and was sent to set data.max_eval_samples. A results.json that does not say (a regression) is no check."""
    try:
        results: Any = run.read_json(RESULTS_FILE)
        scored = sum(int(figures["support"]) for figures in results["per_class"][split].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    if labelled != scored:
        raise CompareError(f"{run.describe(FOLDER, split + SUFFIX)}: {labelled} labelled predictions, where the run "
                           f"scored {scored} ({RESULTS_FILE}): the file was cut short (a copy stopped part-way, a full "
                           f"disk); copy it again, or python train.py eval.only=true model.name_or_path={run.url} "
                           "predicts again, into a folder of its own to compare")


def _line(line: str, where: str, run: str) -> Dict[str, Any]:
    try:
        return dict(json.loads(line))
    except (json.JSONDecodeError, TypeError, ValueError) as err:
        raise CompareError(f"{where}: not a prediction's JSON object ({err}); python train.py eval.only=true "
                           f"model.name_or_path={run} predicts again, into a folder of its own to compare") from None


def _labels(lines: Sequence[Dict[str, Any]]) -> List[str]:
    """The label names in the task's order: the file's probability columns are written in it."""
    return [key[len("probability_"):] for key in lines[0] if key.startswith("probability_")] if lines else []


def _column(lines: Sequence[Dict[str, Any]], key: str, kind: type = object) -> np.ndarray:
    return np.array([line[key] for line in lines], dtype=kind)


def compare_split(split: str, task_a: TaskConfig, task_b: TaskConfig, a: Split, b: Split,
                  other: str = "") -> Comparison:
    """``other``: the runs' settings that choose other examples (:func:`_other_examples`), named if they differ."""
    if (task_a.name, task_a.metrics) != (task_b.name, task_b.metrics):
        raise CompareError(f"{split}: RUN_A's predictions are of task {task_a.name} and RUN_B's of {task_b.name}: "
                           "compare two runs of one task, or --split a split both predicted of one (an eval.extra "
                           "set's, such as hans/validation)")
    same = len(a.idx) == len(b.idx) and bool(np.all(a.idx == b.idx)) and bool(np.all(a.labels == b.labels))
    if not same:
        fix = f"the runs ran with {other}: compare runs evaluated with the same" if other else \
            "compare runs evaluated on the same split, with the same data.max_eval_samples"
        raise CompareError(f"{split}: the runs predicted different examples ({len(a.idx)} and {len(b.idx)} labelled; "
                           f"first to differ: {_first_difference(a, b)}): {fix}")
    found = [metric_difference(name, a, b) for name in task_a.metrics]
    return Comparison(split, len(a.idx), found, None if task_a.is_regression else mcnemar(a, b))


def _first_difference(a: Split, b: Split) -> str:
    for i, (x, y) in enumerate(zip(a.idx.tolist(), b.idx.tolist())):
        if x != y or a.labels[i] != b.labels[i]:
            return f"example {i}: idx {x} and {y}"
    return f"example {min(len(a.idx), len(b.idx))}: in one run only"


def metric_difference(name: str, a: Split, b: Split, resamples: int = RESAMPLES) -> MetricDifference:
    """``name`` on both runs, and B's minus A's with its paired bootstrap interval over ``resamples`` resamples of
    the examples. A metric other than accuracy is recomputed by scikit-learn on each resample: 2,000 of them cost
    seconds per metric and split (F1 on 408 examples, as MRPC's dev set: 14.5 s on 2 AMD EPYC cores)."""
    metric = METRICS[name]
    score_a, score_b = metric(a.predictions, a.labels), metric(b.predictions, b.labels)
    data: Tuple[np.ndarray, ...]
    statistic: Callable[..., Any]
    if name == "accuracy":  # a mean of each example's difference: resampled in NumPy, not a metric call each
        data = ((a.predictions == a.labels).astype(float), (b.predictions == b.labels).astype(float))
        statistic, vectorized = _mean_difference, True
    else:
        def each(rows: np.ndarray) -> float:  # one resample of the examples, the same rows for both runs
            return metric(b.predictions[rows], b.labels[rows]) - metric(a.predictions[rows], a.labels[rows])

        data, statistic, vectorized = (np.arange(len(a.idx)),), each, False
    low, high = differences.interval(data, statistic, paired=True, vectorized=vectorized, resamples=resamples)
    # A correlation of one predicted score is NaN (nli.evaluate.metrics): on a run, or on some resamples of a few
    # examples. The percentiles of the others would be an interval of another statistic.
    undefined = "for a run" if math.isnan(score_a) or math.isnan(score_b) else "on some resamples of the examples"
    difference = differences.Difference(score_b - score_a, low, high, math.nan, paired=True, n_a=len(a.idx),
                                        n_b=len(b.idx), no_interval=f"no interval: {name} is undefined (NaN) "
                                                                    f"{undefined}")
    return MetricDifference(name, score_a, score_b, difference)


def _mean_difference(right_a: np.ndarray, right_b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(right_b - right_a, axis=axis)


def mcnemar(a: Split, b: Split) -> McNemar:
    """McNemar's exact test of the runs' right and wrong answers on the same examples."""
    from scipy.stats import binomtest  # 1.4 s to import: only here

    right_a, right_b = a.predictions == a.labels, b.predictions == b.labels
    only_a, only_b = int(np.sum(right_a & ~right_b)), int(np.sum(right_b & ~right_a))
    discordant = only_a + only_b
    p_value = 1.0 if discordant == 0 else float(binomtest(only_a, discordant, 0.5).pvalue)
    return McNemar(int(np.sum(right_a & right_b)), only_a, only_b, int(np.sum(~right_a & ~right_b)), p_value)


# ------------------------------------------------------------------------------ the printout


METRIC_HEADER = ["split", "examples", "metric", "A", "B", "B - A", "95% interval", "verdict"]
MCNEMAR_HEADER = ["split", "both right", "A only", "B only", "neither", "McNemar p"]


def tables(comparisons: Sequence[Comparison]) -> Tuple[List[List[Any]], List[List[Any]]]:
    metrics = [[c.split, c.examples, m.metric, f"{m.a:.4f}", f"{m.b:.4f}", f"{m.difference.mean:+.4f}",
                "" if math.isnan(m.difference.low) else f"[{m.difference.low:+.4f}, {m.difference.high:+.4f}]",
                differences.verdict(m.difference)]
               for c in comparisons for m in c.metrics]
    tests = [[c.split, c.mcnemar.both, c.mcnemar.only_a, c.mcnemar.only_b, c.mcnemar.neither,
              f"{c.mcnemar.p_value:.3g}"] for c in comparisons if c.mcnemar is not None]
    return metrics, tests


EXPLAINED = [
    "B - A: RUN_B's metric minus RUN_A's on the same examples; 95% interval: percentile bootstrap over the "
    f"examples ({RESAMPLES:,} resamples, the same for both runs); not told apart: the interval holds 0",
    "McNemar p: exact two-sided test of the examples one run gets right and the other wrong (A only, B only)",
]


def markdown(run_a: str, run_b: str, comparisons: Sequence[Comparison]) -> str:
    metrics, tests = tables(comparisons)
    parts = [f"RUN_A: `{run_a}`  \nRUN_B: `{run_b}`", sweep.markdown_table(METRIC_HEADER, metrics)]
    if tests:
        parts.append(sweep.markdown_table(MCNEMAR_HEADER, tests))
    parts.append("\n".join(f"- {line}" for line in EXPLAINED[:1 + bool(tests)]))
    return "\n\n".join(parts) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nli.report compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", metavar="RUN_A", help="a run folder (local or gs://) with eval_predictions/")
    parser.add_argument("run_b", metavar="RUN_B", help="another, evaluated on the same examples")
    parser.add_argument("--split", action="append", default=[], help="a split to compare (default: every split "
                        "both predicted); repeat for several")
    args = parser.parse_args(argv)
    try:
        comparisons = compare_runs(args.run_a, args.run_b, args.split)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(markdown(args.run_a, args.run_b, comparisons), end="")
    return 0
