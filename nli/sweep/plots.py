"""The report's figures (nli.sweep.report, nli.sweep.calibration_plot), drawn on matplotlib's Agg canvas
without pyplot: no display is needed and no global backend is switched for the caller.

A figure's legend goes below its axes, in room the figure adds for it (:func:`legend_below`): the axes keep the
size they were given whatever the legend's length, and the legend covers no line. A legend names at most
:data:`LEGEND_MAX` entries; a figure with more lines colours the best :data:`COLOURED` and draws the rest grey,
unnamed (:func:`highlighted`), the best those of the highest objective, or the lowest where the sweep minimized it
(:func:`ranked`). Labels and tick labels are cut to a readable length (:func:`short_label`, :func:`category_ticks`)."""

from __future__ import annotations

import math
import re
import textwrap
import weakref
from pathlib import Path
from typing import Hashable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend

# Figure sizes in inches at DPI dots per inch: the PNGs are exactly size * DPI pixels.
DPI = 100
LEGEND_MAX = 10  # entries a legend names, lines a plot colours: past that, they cannot be told apart
COLOURED = 5  # of more lines than LEGEND_MAX, the best ones coloured and named; the others grey
GREY = "0.7"
LEGEND_PAD = 0.15  # inches between a legend below the axes and what is above and below it
LEGEND_COLUMNS = 3  # at most, where the figure is wide enough
VALUE_CHARS = 24  # of a value in a label (a long override: a path, a list), at most
LABEL_CHARS = 60  # of a label, at most
TICK_CHARS = 16  # of a category's tick label, at most
SLANT = 30  # degrees: tick labels slanted where they would run together level
# Which way a sweep sought its objective (hydra.sweeper.direction): what the report's best are (ranked).
MAXIMIZE, MINIMIZE = "maximize", "minimize"
# A number with more figures than a plot can show in a label: a search's drawn value (0.0001854647817151324).
LONG_NUMBER = re.compile(r"(?<![\w.])-?\d*\.\d{5,}(?:e[-+]?\d+)?(?![\w.])")

K = TypeVar("K", bound=Hashable)  # what ranked ranks: a line's label, a row's index

# The inches at the bottom of a figure kept for its legend (legend_below), left out of the axes' layout (save).
_reserved: "weakref.WeakKeyDictionary[Figure, float]" = weakref.WeakKeyDictionary()


def figure(size: Tuple[float, float]) -> Figure:
    drawn = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(drawn)  # Agg draws the PNG; it attaches itself to the figure
    return drawn


def compact(label: str) -> str:
    """A label with its long numbers to 3 significant figures: 0.000185 for 0.0001854647817151324."""
    return LONG_NUMBER.sub(lambda number: f"{float(number[0]):.3g}", label)


def cut(text: str, chars: int) -> str:
    """``text`` at most ``chars`` characters long: its start and its end, an ellipsis for what was cut between
    them (the end of a path, its file's name, is what tells two apart)."""
    if len(text) <= chars:
        return text
    head = (chars - 1) // 3
    return text[:head] + "…" + text[len(text) - (chars - 1 - head):]


def short_label(label: str) -> str:
    """A legend's label (``key=value, key=value``): its numbers to 3 significant figures, each value and the
    whole cut to a readable length, so that a long override (a path, a list) cannot widen the legend past the
    figure."""
    parts = [f"{key}={cut(value, VALUE_CHARS)}" if sep else cut(key, VALUE_CHARS)
             for key, sep, value in (part.partition("=") for part in compact(label).split(", "))]
    return cut(", ".join(parts), LABEL_CHARS)


def highlighted(ranked: Sequence[str]) -> Mapping[str, Optional[str]]:
    """The colour of each of the lines ``ranked`` (best first): each its own up to :data:`LEGEND_MAX` lines; past
    that the best :data:`COLOURED` their own and the rest :data:`GREY`. None: a colour of its own, and a name in the
    legend."""
    if len(ranked) <= LEGEND_MAX:
        return {name: f"C{i}" for i, name in enumerate(ranked)}
    return {name: f"C{i}" if i < COLOURED else GREY for i, name in enumerate(ranked)}


def named(colour: Optional[str]) -> bool:
    """Whether a line of ``colour`` (from :func:`highlighted`) is named in the legend: the grey ones are not."""
    return colour != GREY


def legend_below(drawn: Figure, handles: Sequence[Artist], labels: Sequence[str], *, fontsize: str = "small",
                 title: Optional[str] = None) -> Optional[Legend]:
    """One legend for the whole figure, below its axes: as many columns (up to :data:`LEGEND_COLUMNS`) as the
    figure's width holds, and the figure made taller by the legend's height, so that the axes keep their size and
    the legend covers none of them. None where there is nothing to name."""
    if not labels:
        return None
    width, height = drawn.get_size_inches()
    renderer = drawn.canvas.get_renderer()  # type: ignore[attr-defined]
    room = (width - 2 * LEGEND_PAD) * drawn.dpi
    legend: Optional[Legend] = None
    lines, chars = list(labels), max(len(label) for label in labels)
    for columns in [*range(min(LEGEND_COLUMNS, len(labels)), 0, -1), *[1] * 8]:
        if legend is not None:
            legend.remove()
        legend = drawn.legend(handles, lines, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncols=columns,
                              fontsize=fontsize, frameon=False, title=title, title_fontsize=fontsize,
                              borderaxespad=0.0)
        wide = legend.get_window_extent(renderer).width
        if wide <= room:
            break
        if columns == 1:  # too wide in one column: each label on more lines, at its spaces (after its commas)
            chars = max(8, int(chars * room / wide) - 1)
            lines = [textwrap.fill(label, chars, break_on_hyphens=False) for label in labels]
    assert legend is not None
    inches = legend.get_window_extent(renderer).height / drawn.dpi + 2 * LEGEND_PAD
    drawn.set_size_inches(width, height + inches)
    legend.set_bbox_to_anchor((0.5, LEGEND_PAD / (height + inches)), transform=drawn.transFigure)
    _reserved[drawn] = inches
    return legend


def axes_legend_below(axes: Axes, *, fontsize: str = "small") -> Optional[Legend]:
    """:func:`legend_below` of the lines ``axes`` names (their labels as given)."""
    handles, labels = axes.get_legend_handles_labels()
    return legend_below(axes.figure, handles, labels, fontsize=fontsize)  # type: ignore[arg-type]


def category_ticks(axes: Axes, where: Sequence[float], values: Sequence[str]) -> None:
    """A tick at each category, its label cut to :data:`TICK_CHARS`: level where the labels fit side by side, else
    slanted by :data:`SLANT` degrees, or upright where even slanted they would touch (labels ``d`` apart slanted
    by ``a`` stand ``d sin a`` apart), and upright on every few ticks alone where even upright they would."""
    labels = [cut(value, TICK_CHARS) for value in values]
    axes.set_xticks(list(where), labels)
    axes.minorticks_off()
    renderer = axes.figure.canvas.get_renderer()  # type: ignore[attr-defined]
    texts = [label for label in axes.get_xticklabels() if label.get_text()]
    if not texts:
        return
    room = axes.get_window_extent(renderer).width / max(len(labels), 1)  # pixels between two ticks
    line = 1.3 * max(text.get_window_extent(renderer).height for text in texts)  # a label's height, and a gap
    if max(text.get_window_extent(renderer).width for text in texts) <= 0.9 * room:
        return
    angle = SLANT if room * math.sin(math.radians(SLANT)) >= line else 90
    every = max(1, math.ceil(line / room))
    for i, text in enumerate(texts):
        text.set(rotation=angle, horizontalalignment="right" if angle != 90 else "center", rotation_mode="anchor"
                 if angle != 90 else "default", visible=i % every == 0)


def save(drawn: Figure, path: Path) -> None:
    reserved = _reserved.get(drawn, 0.0)
    height = drawn.get_size_inches()[1]
    drawn.tight_layout(rect=(0.0, reserved / height, 1.0, 1.0))
    drawn.savefig(path, dpi=DPI)


def ranked(objectives: Mapping[K, Sequence[float]], direction: str = MAXIMIZE) -> List[K]:
    """Names best first by the mean of their objectives: the highest, as every objective of the project is, or the
    lowest where the sweep minimized it (its ``hydra.sweeper.direction``); a name with no finite objective last."""
    lowest = direction == MINIMIZE

    def mean(name: K) -> float:
        finite = [value for value in objectives[name] if math.isfinite(value)]
        return sum(finite) / len(finite) if finite else math.inf if lowest else -math.inf

    return sorted(objectives, key=mean, reverse=not lowest)


def best(direction: str, word: str = "best") -> str:
    """How a plot's text names the lines :func:`ranked` puts first: ``word`` where higher is better, "lowest" where
    the sweep minimized (its best then are not what "best" of a score reads as)."""
    return "lowest" if direction == MINIMIZE else word
