"""The report's figures (nli.sweep.report, nli.sweep.calibration_plot), drawn on matplotlib's Agg canvas
without pyplot: no display is needed and no global backend is switched for the caller."""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# Figure sizes in inches at DPI dots per inch: the PNGs are exactly size * DPI pixels.
DPI = 100
LEGEND_MAX = 12  # lines a legend names; past that it hides the plot
LEGEND_ROW, LEGEND_PAD = 0.2, 0.4  # inches a legend below the axes takes: each line's, and its margins


def figure(size: Tuple[float, float]) -> Figure:
    drawn = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(drawn)  # Agg draws the PNG; it attaches itself to the figure
    return drawn


def legend(axes: Axes, lines: int, fontsize: str = "small", *, below: bool = False) -> None:
    """A legend where it names every line and hides nothing: up to :data:`LEGEND_MAX` lines; ``below`` the axes,
    outside them, in a figure that has :data:`LEGEND_ROW` inches a line for it: inside, a search's trials (a line of
    one point each, anywhere on the axes) fall under it."""
    if 0 < lines <= LEGEND_MAX and axes.get_legend_handles_labels()[1]:
        if below:
            axes.legend(fontsize=fontsize, loc="upper center", bbox_to_anchor=(0.5, -0.15), frameon=False)
        else:
            axes.legend(fontsize=fontsize)


def save(drawn: Figure, path: Path) -> None:
    drawn.tight_layout()
    drawn.savefig(path, dpi=DPI)
