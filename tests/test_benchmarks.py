"""The benchmark scripts run end to end on a few steps (correctness only: no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

TINY = ["experiment=quickstart", "hw=cpu", "data.synthetic_train_size=128", "data.synthetic_eval_size=32",
        "model.scratch.dropout=0"]


def test_scaling_runs_one_and_two_processes(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scaling.py"), "--processes", "1", "2",
                           "--steps", "3", "--repeats", "1", "--json", str(out), "--", *TINY],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["processes"] for row in rows] == [1, 2]
    assert rows[0]["speedup"] == 1 and rows[0]["efficiency"] == 1
    assert all(row["examples_per_second"] > 0 for row in rows)
    assert abs(rows[1]["efficiency"] - rows[1]["speedup"] / 2) <= 1e-3  # each rounded to 3 places
    assert rows[0]["objective"] == rows[1]["objective"]  # the same run, split over two processes
    assert "efficiency" in proc.stdout and f"written to {out}" in proc.stdout
