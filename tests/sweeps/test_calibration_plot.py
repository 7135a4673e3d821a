"""The report's reliability diagrams (nli/sweep/calibration_plot.py) from rows made here: what each panel draws, the
runs past the legend's limit left out and said so, and no section for runs from before calibration was kept.
A real sweep's report draws them too (tests/sweeps/test_report.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

import matplotlib.image
import pytest
from matplotlib.figure import Figure

from nli.sweep import calibration_plot, plots


def figures(count: List[int], confidence: List[Any], accuracy: List[Any], ece: float) -> Dict[str, Any]:
    return {"bins": 15, "count": count, "confidence": confidence, "accuracy": accuracy, "ece": ece}


# Two non-empty bins of 15: 3 examples at mean confidence 0.45 (2 right), 5 at 0.95 (4 right).
COUNT = [0] * 6 + [3] + [0] * 7 + [5]
CONFIDENCE = [None] * 6 + [0.45] + [None] * 7 + [0.95]
ACCURACY = [None] * 6 + [2 / 3] + [None] * 7 + [0.8]


def test_a_panel_draws_the_diagonal_and_each_runs_non_empty_bins() -> None:
    axes = Figure().subplots()
    calibration_plot.panel(axes, "hans/validation", [("seed=1", figures(COUNT, CONFIDENCE, ACCURACY, 0.1234))])
    diagonal, line = axes.lines
    assert list(diagonal.get_xdata()) == list(diagonal.get_ydata()) == [0.0, 1.0]
    assert list(line.get_xdata()) == [0.45, 0.95] and list(line.get_ydata()) == [2 / 3, 0.8]
    assert line.get_label() == "seed=1, ECE 0.123" and axes.get_title() == "hans/validation"


def test_runs_past_the_legends_limit_are_left_out_and_said_so(tmp_path: Path) -> None:
    """Of 11 runs, the 10 of the highest objective, their order kept (job 3 scored lowest: left out)."""
    matched, mismatched = (figures(COUNT, CONFIDENCE, ACCURACY, ece) for ece in (0.1, 0.2))
    runs = [{"job": i, "seed": i, "objective": 0.1 if i == 3 else 0.5 + 0.01 * i,
             "calibration": {"validation_matched": matched,  # the first run has one split only
                             **({"validation_mismatched": mismatched} if i else {})}}
            for i in range(calibration_plot.LEGEND_MAX + 1)]
    written: List[Path] = []
    (text,) = calibration_plot.section(runs, ["seed"], tmp_path, written)
    assert written == [tmp_path / calibration_plot.RELIABILITY]
    assert text.startswith("## Calibration\n\nReliability diagrams of each run's final evaluation")
    assert (f"The 10 of the 11 completed runs with the highest objective are drawn.\n\n"
            f"![reliability diagrams]({written[0].name})") in text
    pixels = matplotlib.image.imread(written[0])  # a panel per split, side by side, and the legend below them
    assert pixels.shape[1] == 800 and pixels.shape[0] > 400 and calibration_plot.size(2) == (8.0, 4.0)
    assert calibration_plot.size(10) == (12.0, 16.0)  # three a row


def test_of_a_search_that_minimized_the_runs_of_the_lowest_objective_are_drawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Of 11 runs of a search with hydra.sweeper.direction=minimize, the 10 of the lowest objective: the highest, job
    10, left out (it drew the 10 of the highest, the search's worst)."""
    drawn: List[List[str]] = []
    monkeypatch.setattr(calibration_plot, "plot", lambda runs, path: drawn.append([label for label, _ in runs]))
    bins = {"validation": figures(COUNT, CONFIDENCE, ACCURACY, 0.1)}
    runs = [{"job": i, "seed": i, "objective": 0.5 + 0.01 * i, "calibration": bins}
            for i in range(calibration_plot.LEGEND_MAX + 1)]
    (text,) = calibration_plot.section(runs, ["seed"], tmp_path, [], plots.MINIMIZE)
    assert drawn == [[f"seed={i}" for i in range(10)]]
    assert "The 10 of the 11 completed runs with the lowest objective are drawn." in text


def test_one_legend_below_the_panels_names_each_run_once_with_its_ece_on_each_split() -> None:
    """A legend in each panel, of every run, covered the diagrams: now one for the figure, below them."""
    matched, mismatched = (figures(COUNT, CONFIDENCE, ACCURACY, ece) for ece in (0.1, 0.2))
    runs = [(f"seed={i}", {"validation_matched": matched, **({"validation_mismatched": mismatched} if i else {})})
            for i in range(calibration_plot.LEGEND_MAX)]
    drawn = calibration_plot.figure(runs)
    plots.save(drawn, Path(os.devnull))
    renderer = drawn.canvas.get_renderer()
    (legend,) = drawn.legends
    panels = [axes for axes in drawn.axes if axes.get_visible()]
    assert len(panels) == 2 and all(axes.get_legend() is None for axes in panels)
    assert [text.get_text() for text in legend.get_texts()] == ["seed=0, ECE 0.100 / -"] + [
        f"seed={i}, ECE 0.100 / 0.200" for i in range(1, 10)]
    box, (width, height) = legend.get_window_extent(renderer), drawn.get_size_inches() * drawn.dpi
    assert all(box.y1 <= axes.get_tightbbox(renderer).y0 for axes in panels)  # below the panels and their labels
    assert 0 <= box.x0 and box.x1 <= width and 0 <= box.y0 and box.y1 <= height
    # A run has one colour on every panel.
    assert [line.get_color() for line in panels[0].get_lines()[1:]][1:] == \
        [line.get_color() for line in panels[1].get_lines()[1:]]


def test_runs_from_before_calibration_was_kept_have_no_section(tmp_path: Path) -> None:
    written: List[Path] = []
    assert calibration_plot.section([{"job": 0, "objective": 0.5}], [], tmp_path, written) == []
    assert written == [] and not (tmp_path / calibration_plot.RELIABILITY).exists()
