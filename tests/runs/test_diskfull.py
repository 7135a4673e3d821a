"""A run on a disk that fills (tests/support/diskfull.py points a file the run writes at /dev/full): a clear word,
not a traceback per line, and nothing already saved lost."""

from __future__ import annotations

from pathlib import Path

from tests.support.diskfull import full, needs_full
from tests.support.runs import FAST, read_results, run_app


@needs_full
def test_a_log_file_the_disk_will_not_take_is_one_warning_and_the_run_goes_on(tmp_path: Path) -> None:
    """Every line logged after train.log's disk filled printed "--- Logging error ---" and a traceback on stderr;
    now one warning, the run's lines on the console, and its last lines say the log was cut short."""
    run_dir = tmp_path / "run"
    full(run_dir / "train.log")
    proc = run_app([*FAST, f"output_dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Logging error" not in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    warned = [line for line in proc.stdout.splitlines() if "could not be written" in line]
    assert len(warned) == 1 and f"the run's log {run_dir / 'train.log'} could not be written (No space left on " \
        "device): the run goes on, its lines on the console only" in warned[0]
    assert "step 12: loss=" in proc.stdout  # the run's lines, on the console
    listed = next(line for line in proc.stdout.split("The run's files:\n")[1].splitlines() if line.split()[0] == "log")
    assert "train.log (cut short at " in listed and "No space left on device; the rest is in the console's output)" \
        in listed
    assert read_results(run_dir)["status"] == "completed"
