"""The CSV logger on a disk that fills (nli/tracking/loggers.py): its writes go through the run's storage, so a full
disk is said as a full disk, and metrics.csv stays a file of whole rows that the report reads."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from nli.config.schema import CsvConfig
from nli.errors import StorageError
from nli.io.storage import write_failed
from nli.sweep.report import read_curves
from nli.tracking.loggers import CsvTracker, RunInfo, Trackers
from tests.support.diskfull import room

HEADER = "step,metric,value,wall_time\n"


def _run(folder: Path, *, resume_step: int | None = None) -> RunInfo:
    return RunInfo(name="run", group=None, config={}, log_dir=folder, resume_id=None, resume_step=resume_step)


def test_a_row_the_disk_fills_in_the_middle_of_is_taken_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills 10 bytes into a row: the run is told which file and why, and metrics.csv ends at the row
    before, whole, as the report reads it (a half row was a TypeError in the report's curves)."""
    tracker = CsvTracker(run=_run(tmp_path), file="metrics.csv")
    tracker.log({"train/loss": 0.5}, step=3)
    before = (tmp_path / "metrics.csv").read_bytes()
    room(monkeypatch, tmp_path / "metrics.csv", 10)
    with pytest.raises(StorageError, match=r"could not write .*metrics\.csv: no space left on its disk: make room") \
            as raised:
        tracker.log({"train/loss": 0.25, "train/lr": 1e-5}, step=6)
    assert write_failed(raised.value)
    assert (tmp_path / "metrics.csv").read_bytes() == before
    assert read_curves(str(tmp_path / "metrics.csv")) == {"train/loss": {3: 0.5}}


def test_a_row_an_earlier_attempt_left_cut_short_is_left_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "metrics.csv").write_text(f"{HEADER}3,train/loss,0.5,1.0\r\n6,train/lo")
    tracker = CsvTracker(run=_run(tmp_path, resume_step=3), file="metrics.csv")
    assert "its last row was cut short ('6,train/lo')" in caplog.text
    tracker.log({"train/loss": 0.25}, step=6)
    assert read_curves(str(tmp_path / "metrics.csv")) == {"train/loss": {3: 0.5, 6: 0.25}}


def test_an_empty_metrics_csv_gets_its_header(tmp_path: Path) -> None:
    """A metrics.csv made but left empty (the disk full as its header was written): rows without a header were
    unreadable to the report."""
    (tmp_path / "metrics.csv").touch()
    CsvTracker(run=_run(tmp_path), file="metrics.csv").log({"train/loss": 0.5}, step=3)
    assert (tmp_path / "metrics.csv").read_text().startswith(HEADER)
    assert read_curves(str(tmp_path / "metrics.csv")) == {"train/loss": {3: 0.5}}


def test_a_full_disk_as_the_loggers_start_is_said_as_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not inside Hydra's "Error in call to target 'nli.tracking.CsvTracker'", which the run showed as a traceback."""
    room(monkeypatch, tmp_path / "metrics.csv", 0)
    trackers = Trackers({"csv": CsvConfig(_target_="nli.tracking.CsvTracker")})
    with pytest.raises(StorageError, match=r"^could not write .*metrics\.csv: no space left on its disk"):
        trackers.start(_run(tmp_path))
    assert not (tmp_path / "metrics.csv").read_bytes()


class FullDiskLogger:
    """A logger whose library meets a full disk as it starts, and says so in an error of its own."""

    def __init__(self, *, run: RunInfo, file: str) -> None:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run.log_dir / "events"))
        except OSError as err:
            raise RuntimeError("the logger's service could not start") from err


def test_any_logger_meeting_a_full_disk_as_it_starts_is_said_as_a_full_disk(tmp_path: Path) -> None:
    """A logger's own error (W&B's, TensorBoard's) around the OSError was Hydra's "Error in call to target"."""
    trackers = Trackers({"mine": CsvConfig(_target_=f"{__name__}.FullDiskLogger")})
    with pytest.raises(StorageError, match=re.escape(f"logger.mine could not write its files in {tmp_path}: no space "
                                                     "left on its disk: make room there")) as raised:
        trackers.start(_run(tmp_path))
    assert write_failed(raised.value)


def test_the_per_class_files_are_written_whole(tmp_path: Path) -> None:
    from nli.evaluate.per_class import SplitAnalysis

    tracker = CsvTracker(run=_run(tmp_path), file="metrics.csv")
    analysis = SplitAnalysis(split="validation", labels=["yes", "no"], matrix=[[3, 1], [0, 4]], per_class={
        "yes": {"precision": 1.0, "recall": 0.75, "f1": 0.857, "support": 4},
        "no": {"precision": 0.8, "recall": 1.0, "f1": 0.889, "support": 4}})
    tracker.log_classes([analysis], step=8)
    assert (tmp_path / "per_class.csv").read_text().splitlines()[:2] == [
        "split,label,precision,recall,f1,support", "validation,yes,1.0,0.75,0.857,4"]
    assert (tmp_path / "confusion.csv").read_text().splitlines()[1:3] == ["validation,yes,yes,3", "validation,yes,no,1"]
    assert not [path.name for path in tmp_path.iterdir() if path.name.startswith(".")]  # no staging file left
