"""The report's reliability diagrams: on each eval split, each completed run's accuracy against its
confidence in the 15 equal-width bins of its final evaluation (results.json's ``calibration``,
nli.evaluate.reliability), beside the diagonal where the two are equal.

Drawn as the report's other plots are (nli.sweep.report): on matplotlib's Agg canvas, without pyplot.
Runs from before calibration was kept have no bins: a report of those alone has no such section.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from nli.sweep import plots
from nli.sweep.plots import LEGEND_MAX  # runs drawn: past that, their lines hide each other and the diagonal

RELIABILITY = "reliability.png"
CALIBRATION = "calibration"  # results.json's key (nli.evaluate.reliability): split -> its bins and figures
PANEL = (4.0, 4.0)  # inches, each split's square panel
COLUMNS = 3  # panels a row: MNLI with HANS, SNLI and ANLI has ten splits
CAPTION = ("Reliability diagrams of each run's final evaluation (`calibration` in results.json): on each eval split, "
           "the accuracy against the mean confidence (the predicted label's probability) in each of 15 equal-width "
           "confidence bins, empty bins left out; on the dashed diagonal a model is calibrated, below it "
           "over-confident. The legend gives each run's expected calibration error (ECE), on each split in the order "
           "of the panels.")

Bins = Mapping[str, Any]  # one split's figures in results.json's calibration


def section(done: Sequence[Mapping[str, Any]], keys: Sequence[str], out: Path, written: List[Path],
            direction: str = plots.MAXIMIZE) -> List[str]:
    """The report's calibration section for the completed rows ``done``, its PNG added to ``written``; none
    where no row has calibration figures. Past :data:`LEGEND_MAX` runs, the best are drawn: those of the highest
    objective, or the lowest where the sweep minimized it (``direction``, nli.sweep.plots.ranked)."""
    rows = [row for row in done if isinstance(row.get(CALIBRATION), dict) and row[CALIBRATION]]
    if not rows:
        return []
    # Of runs alike, the earlier (ranked's sort is stable); drawn in their order.
    best = set(plots.ranked({i: [_objective(row)] for i, row in enumerate(rows)}, direction)[:LEGEND_MAX])
    runs = [(_label(row, keys), row[CALIBRATION]) for i, row in enumerate(rows) if i in best]
    plot(runs, out / RELIABILITY)
    written.append(out / RELIABILITY)
    left = (f" The {LEGEND_MAX} of the {len(rows)} completed runs with the {plots.best(direction, 'highest')} "
            "objective are drawn." if len(rows) > LEGEND_MAX else "")
    return [f"## Calibration\n\n{CAPTION}{left}\n\n![reliability diagrams]({RELIABILITY})"]


def _objective(row: Mapping[str, Any]) -> float:
    value = row.get("objective")
    return float(value) if isinstance(value, (int, float)) else math.nan  # not a number: ranked puts it last


def size(panels: int) -> Tuple[float, float]:
    """The size in inches of the panels of ``panels`` splits, up to :data:`COLUMNS` a row; the figure adds its
    legend's height below them (nli.sweep.plots.legend_below)."""
    columns = min(panels, COLUMNS)
    return PANEL[0] * columns, PANEL[1] * math.ceil(panels / columns)


def figure(runs: Sequence[Tuple[str, Mapping[str, Bins]]]) -> Figure:
    """A panel per split that any run has, a line per run in a colour of its own on every panel, the diagonal, and
    one legend below the panels naming each run with its ECE on each split."""
    splits = list(dict.fromkeys(split for _, splits in runs for split in splits))
    drawn = plots.figure(size(len(splits)))
    columns = min(len(splits), COLUMNS)
    grid = drawn.subplots(math.ceil(len(splits) / columns), columns, squeeze=False)
    panels = [axes for row in grid for axes in row]
    handles: Dict[int, Line2D] = {}  # run -> its line on the first panel it is on
    for axes, split in zip(panels, splits):
        on = [i for i, (_, figures) in enumerate(runs) if split in figures]
        lines = panel(axes, split, [(runs[i][0], runs[i][1][split]) for i in on], [f"C{i}" for i in on])
        for i, line in zip(on, lines):
            handles.setdefault(i, line)
    for unused in panels[len(splits):]:
        unused.set_visible(False)
    plots.legend_below(drawn, [handles[i] for i in sorted(handles)],
                       [f"{plots.short_label(runs[i][0])}, ECE {_eces(runs[i][1], splits)}" for i in sorted(handles)])
    return drawn


def _eces(figures: Mapping[str, Bins], splits: Sequence[str]) -> str:
    """A run's ECE on each split, in the order of the panels: '-' where it has none there."""
    def ece(split: str) -> str:
        value = (figures.get(split) or {}).get("ece")
        return f"{value:.3f}" if isinstance(value, (int, float)) else "-"

    return " / ".join(ece(split) for split in splits)


def plot(runs: Sequence[Tuple[str, Mapping[str, Bins]]], path: Path) -> None:
    plots.save(figure(runs), path)


def panel(axes: Axes, split: str, runs: Sequence[Tuple[str, Bins]],
          colours: Optional[Sequence[str]] = None) -> List[Line2D]:
    """One split's diagram: the diagonal first, then each run's non-empty bins, (confidence, accuracy), in its
    colour of ``colours``; the runs' lines."""
    axes.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="grey", linewidth=1)  # calibrated
    lines = []
    for i, (label, figures) in enumerate(runs):
        points = [(confidence, accuracy) for n, confidence, accuracy
                  in zip(figures.get("count", []), figures.get("confidence", []), figures.get("accuracy", [])) if n]
        ece = figures.get("ece")
        named = f"{label}, ECE {ece:.3f}" if isinstance(ece, (int, float)) else label
        (line,) = axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=named,
                            color=colours[i] if colours else None)
        lines.append(line)
    axes.set(title=split, xlim=(0.0, 1.0), ylim=(0.0, 1.0), aspect="equal", xlabel="confidence (mean in its bin)",
             ylabel="accuracy")
    return lines


def _label(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    """A run as the learning curves name it: its swept values, else its job number."""
    return ", ".join(f"{key}={row.get(key)}" for key in keys) or f"job {row.get('job')}"
