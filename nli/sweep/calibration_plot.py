"""The report's reliability diagrams: on each eval split, each completed run's accuracy against its
confidence in the 15 equal-width bins of its final evaluation (results.json's ``calibration``,
nli.evaluate.reliability), beside the diagonal where the two are equal.

Drawn as the report's other plots are (nli.sweep.report): on matplotlib's Agg canvas, without pyplot.
Runs from before calibration was kept have no bins: a report of those alone has no such section.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, List, Mapping, Sequence, Tuple

from matplotlib.axes import Axes

from nli.sweep import plots
from nli.sweep.plots import LEGEND_MAX  # runs drawn: past that, their lines hide each other and the diagonal

RELIABILITY = "reliability.png"
CALIBRATION = "calibration"  # results.json's key (nli.evaluate.reliability): split -> its bins and figures
PANEL = (4.0, 4.0)  # inches, each split's square panel
COLUMNS = 3  # panels a row: MNLI with HANS, SNLI and ANLI has ten splits
CAPTION = ("Reliability diagrams of each run's final evaluation (`calibration` in results.json): on each eval split, "
           "the accuracy against the mean confidence (the predicted label's probability) in each of 15 equal-width "
           "confidence bins, empty bins left out; on the dashed diagonal a model is calibrated, below it "
           "over-confident. The legend gives each run's expected calibration error (ECE).")

Bins = Mapping[str, Any]  # one split's figures in results.json's calibration


def section(done: Sequence[Mapping[str, Any]], keys: Sequence[str], out: Path, written: List[Path]) -> List[str]:
    """The report's calibration section for the completed rows ``done``, its PNG added to ``written``; none
    where no row has calibration figures."""
    runs = [(_label(row, keys), row[CALIBRATION]) for row in done if isinstance(row.get(CALIBRATION), dict)
            and row[CALIBRATION]]
    if not runs:
        return []
    plot(runs[:LEGEND_MAX], out / RELIABILITY)
    written.append(out / RELIABILITY)
    left = f" The first {LEGEND_MAX} of the {len(runs)} completed runs are drawn." if len(runs) > LEGEND_MAX else ""
    return [f"## Calibration\n\n{CAPTION}{left}\n\n![reliability diagrams]({RELIABILITY})"]


def size(panels: int) -> Tuple[float, float]:
    """The figure's size in inches for ``panels`` splits: up to :data:`COLUMNS` a row."""
    columns = min(panels, COLUMNS)
    return PANEL[0] * columns, PANEL[1] * math.ceil(panels / columns)


def plot(runs: Sequence[Tuple[str, Mapping[str, Bins]]], path: Path) -> None:
    """A panel per split that any run has, a line per run, and the diagonal."""
    splits = list(dict.fromkeys(split for _, splits in runs for split in splits))
    figure = plots.figure(size(len(splits)))
    columns = min(len(splits), COLUMNS)
    grid = figure.subplots(math.ceil(len(splits) / columns), columns, squeeze=False)
    panels = [axes for row in grid for axes in row]
    for axes, split in zip(panels, splits):
        panel(axes, split, [(label, figures[split]) for label, figures in runs if split in figures])
    for unused in panels[len(splits):]:
        unused.set_visible(False)
    plots.save(figure, path)


def panel(axes: Axes, split: str, runs: Sequence[Tuple[str, Bins]]) -> None:
    """One split's diagram: the diagonal first, then each run's non-empty bins, (confidence, accuracy)."""
    axes.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="grey", linewidth=1)  # calibrated
    for label, figures in runs:
        points = [(confidence, accuracy) for n, confidence, accuracy
                  in zip(figures.get("count", []), figures.get("confidence", []), figures.get("accuracy", [])) if n]
        ece = figures.get("ece")
        named = f"{label}, ECE {ece:.3f}" if isinstance(ece, (int, float)) else label
        axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=named)
    axes.set(title=split, xlim=(0.0, 1.0), ylim=(0.0, 1.0), aspect="equal", xlabel="confidence (mean in its bin)",
             ylabel="accuracy")
    if axes.get_legend_handles_labels()[1]:
        axes.legend(fontsize="x-small", loc="upper left")


def _label(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    """A run as the learning curves name it: its swept values, else its job number."""
    return ", ".join(f"{key}={row.get(key)}" for key in keys) or f"job {row.get('job')}"

