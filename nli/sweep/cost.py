"""What a sweep's jobs used: each job's GPU-hours, under every launcher, and a Vertex AI job's estimated cost in
USD (its launcher prices it: launch/hydra_plugins/vertex_launcher/_cost.py), with their totals for the table
printed at the sweep's end and for its report.

Both are columns of a job's row beside its results, never metrics: a seed's mean of them says nothing of the
model (nli.sweep.table leaves them out of the metrics). A job without GPUs (``hw=cpu``, or ``hw=auto``, which
does not say how many it uses) has no ``gpu_hours`` column rather than a 0: a CPU sweep's table stays as it was.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

COST_USD, GPU_HOURS = "cost_usd", "gpu_hours"  # the row's columns
COLUMNS = (COST_USD, GPU_HOURS)
ROUNDING = 6  # decimals kept: a millionth of a dollar, of a GPU-hour (3.6 GPU-milliseconds)


def gpu_hours(gpus: int, seconds: float) -> Dict[str, float]:
    """The ``gpu_hours`` column of a job that held ``gpus`` GPUs (on all its machines) for ``seconds``; none
    for a job without GPUs."""
    if gpus <= 0 or seconds < 0:
        return {}
    return {GPU_HOURS: round(gpus * seconds / 3600, ROUNDING)}


def gpus_of(config: DictConfig) -> int:
    """The GPUs a job of this config holds on all its machines: ``hw.gpus_per_node`` on each of ``hw.nodes``."""
    per_node = OmegaConf.select(config, "hw.gpus_per_node", default=0) or 0
    return int(per_node) * int(OmegaConf.select(config, "hw.nodes", default=1) or 1)


def job_columns(config: DictConfig, started: Optional[float], ended: float) -> Dict[str, float]:
    """A job's GPU-hours from when it started (the callback's on_job_start) to ``ended``: the row of a job of
    Hydra's own, joblib's or submitit's launcher."""
    return gpu_hours(gpus_of(config), ended - started) if started is not None else {}


def totals(rows: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
    """Each cost column's sum over the rows that have it (failed jobs too: they ran); none where no row has it."""
    found: Dict[str, float] = {}
    for column in COLUMNS:
        values = [float(row[column]) for row in rows if isinstance(row.get(column), (int, float))]
        if values:
            found[column] = sum(values)
    return found


def summary(rows: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """The line under a sweep's table: its total estimated cost and GPU-hours; None where its rows have neither."""
    found = totals(rows)
    parts = []
    if COST_USD in found:
        priced = sum(COST_USD in row for row in rows)
        parts.append(f"estimated cost ${found[COST_USD]:.2f} over {priced} of {len(rows)} jobs (from each job's run "
                     "time and hydra.launcher.prices: an estimate, not a bill)")
    if GPU_HOURS in found:
        parts.append(f"{found[GPU_HOURS]:.2f} GPU-hours")
    return f"The sweep used: {'; '.join(parts)}" if parts else None


def markdown_note(rows: Sequence[Mapping[str, Any]]) -> str:
    """The same line under the report's table of jobs (nli.sweep.report); nothing where the rows have neither."""
    line = summary(rows)
    return f"\n\n{line}." if line else ""
