"""What a sweep's jobs used (nli/sweep/cost.py): a local job's GPU-hours in its row, none for a job without GPUs,
the totals under the printed table and the report's, and neither column taken for a metric."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict

import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from nli.sweep import cost, report
from nli.sweep import table as sweep


def _end_job(sweep_dir: Path, hw: Dict[str, Any], ran_seconds: float) -> Dict[str, Any]:
    """A job of Hydra's own launcher that ran ``ran_seconds`` ending, as SweepResults records it; its row."""
    config = OmegaConf.create({"hw": hw, "output_dir": str(sweep_dir / "0"), "hydra": {
        "mode": RunMode.MULTIRUN, "sweep": {"dir": str(sweep_dir)}, "job": {"num": 0},
        "overrides": {"task": ["seed=1"]}, "runtime": {"output_dir": str(sweep_dir / "0")}}})
    callback = sweep.SweepResults()
    callback.job = {"started": time.time() - ran_seconds}  # as on_job_start left it
    callback.on_job_end(config, JobReturn(status=JobStatus.COMPLETED, _return_value=0.5))
    (row,) = sweep.read_rows(sweep_dir)
    return row


def test_a_local_job_with_gpus_has_its_gpu_hours_and_a_cpu_job_none(tmp_path: Path) -> None:
    row = _end_job(tmp_path / "gpus", {"gpus_per_node": 2, "nodes": 2}, ran_seconds=1800)
    assert row[cost.GPU_HOURS] == pytest.approx(2.0, abs=1e-3)  # 4 GPUs for half an hour
    assert row["objective"] == 0.5 and "cost_usd" not in row  # no price outside Vertex AI
    assert cost.GPU_HOURS not in _end_job(tmp_path / "cpu", {"gpus_per_node": 0, "nodes": 1}, ran_seconds=60)


def test_the_columns_are_totalled_not_averaged_as_metrics() -> None:
    rows = [{"job": num, "state": "COMPLETED", "overrides": [f"seed={num}"], "seed": str(num),
             "objective": 0.5 + num / 10, "cost_usd": 1.25 * (num + 1), "gpu_hours": 0.5} for num in range(2)]
    rows.append({"job": 2, "state": "FAILED", "overrides": ["seed=2"], "seed": "2", "error": "boom", "gpu_hours": 0.25})
    assert sweep.metric_columns(rows) == ["objective"]
    (group,) = sweep.seed_groups(rows)
    assert "cost_usd_mean" not in group and "gpu_hours_mean" not in group
    assert cost.totals(rows) == {"cost_usd": 3.75, "gpu_hours": 1.25}
    assert cost.summary(rows) == ("The sweep used: estimated cost $3.75 over 2 of 3 jobs (from each job's run time "
                                  "and hydra.launcher.prices: an estimate, not a bill); 1.25 GPU-hours")
    table = report.job_table(rows, ["seed"], report.model_metrics(rows), folders=False)
    assert table.splitlines()[0] == "| job | state | seed | objective | cost_usd | gpu_hours | error |"
    assert "| 1 | COMPLETED | 1 | 0.6000 | 2.5000 | 0.5000 |  |" in table
    assert cost.markdown_note(rows) == f"\n\n{cost.summary(rows)}."
    assert cost.summary([{"job": 0, "objective": 1.0}]) is None and cost.markdown_note([]) == ""
