"""The GPU check's report: gpu_check.json and gpu_check.md, each rewritten whole as a line ends."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List

from benchmarks.gpu_check.subruns import OUT_OF_TIME, Line

# The report's folder: these files and no others, so that a device run that brings back a handful of files brings
# back all of it (a folder of its own, nothing below it): the report, the speed lines' benchmark output (each
# benchmarks.vs_trainer --out, gathered), and the tail of each failed sub-run's output.
REPORT_FILES = ("gpu_check.json", "gpu_check.md", "benchmarks.json", "benchmarks.md", "logs.txt")


def write_report(out: Path, header: Dict[str, Any], lines: List[Line], seconds: float) -> None:
    """gpu_check.json and gpu_check.md, rewritten whole (each write replaces the file atomically)."""
    document = {**header, "seconds": round(seconds, 1), "lines": [asdict(line) for line in lines]}
    atomic_write(out / "gpu_check.json", json.dumps(document, indent=2) + "\n")
    env = header["environment"]
    md = [f"# GPU check: {header['device']}", "",
          f"Ran on {header['ran_on']}" + (" (a CPU rehearsal: no GPU figures)" if header["ran_on"] == "cpu" else "")
          + f"; {seconds:.0f} s in all.", "", gpu_counts(env), "",
          "| environment | |", "|---|---|", *[f"| {key} | {value} |" for key, value in env.items()], "",
          "| line | result | figures | seconds |", "|---|---|---|---:|"]
    long: List[str] = []  # lists too long for a cell (the presets' pairs), each under its line's title
    for line in lines:
        result = line.status + (f": {line.detail}" if line.detail and line.status in ("fail", OUT_OF_TIME) else "")
        cells = []
        for key, value in line.figures.items():
            if isinstance(value, list) and len(value) > 5:
                long += ["", f"{line.title}, {key}:", "", *[f"- {item}" for item in value]]
                value = f"({len(value)} below)"
            cells.append(f"{key}={json.dumps(value) if isinstance(value, (dict, list)) else value}")
        md.append(f"| {line.title} | {result} | {'; '.join(cells)} | {line.seconds:.0f} |".replace("\n", " "))
    if str(header.get("kit", "")).startswith("failed"):
        md[4:4] = [f"**The kit** (Hydra, OmegaConf, datasets) **did not install**: {header['kit']}", ""]
    late = [line.title for line in lines if line.status == OUT_OF_TIME]
    if late:
        budget = f" (--budget {header['budget_seconds']:.0f} s)" if header.get("budget_seconds") else ""
        md[4:4] = [f"**Skipped for time**{budget}, cut or never started: " + "; ".join(late) + ".", ""]
    if header.get("refused"):
        md[4:4] = [f"**No line ran**: {header['refused']}.", ""]
    if header.get("stopped_by"):
        md[4:4] = [f"**The check was stopped by {header['stopped_by']}**: the lines it ran are below.", ""]
    md += ["", "What passing means, line by line:", ""]
    md += [f"- {line.title}: {line.detail}" for line in lines
           if line.detail and line.status not in ("fail", OUT_OF_TIME)]
    md += long
    logs = [log for line in lines for log in line.logs]
    if logs:
        md += ["", "Failed sub-runs' output, the tail of each, in logs.txt: " + ", ".join(log.split(": ", 1)[-1]
                                                                                 for log in logs)]
    atomic_write(out / "gpu_check.md", "\n".join(md) + "\n")


def gpu_counts(env: Dict[str, Any]) -> str:
    """The report's sentence on the GPUs, as torch and as NVML see them."""
    seen, listed = env.get("gpus_torch", "(unknown)"), env.get("gpus_nvml")
    said = f"nvidia-smi (NVML) lists {listed}" if listed is not None else f"NVML did not answer ({env.get('nvml')})"
    differ = listed is not None and seen != listed
    return (("**They differ:** " if differ else "") + f"GPUs: torch sees {seen}; {said}"
            + (f"; CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in os.environ
               else "") + (f" ({env['cuda_error']})" if differ and env.get("cuda_error") else "") + ".")


def atomic_write(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        f.write(text)
    os.replace(f.name, path)


