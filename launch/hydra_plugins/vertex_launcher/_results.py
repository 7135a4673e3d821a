"""What comes back from a job's output directory, and the sweep's table of jobs x overrides x metrics."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

import fsspec

log = logging.getLogger(__name__)


def read_json(url: str) -> Optional[Dict[str, Any]]:
    """A JSON file in the job's output directory (gs:// or local); None when the job wrote none."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        return json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None


def write_table(sweep_dir: Path, rows: List[Dict[str, Any]]) -> None:
    """sweep_results.csv and .jsonl in the sweep directory, and the table in the log."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(sweep_dir / "sweep_results.csv", "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    with open(sweep_dir / "sweep_results.jsonl", "w") as stream:
        stream.writelines(json.dumps(row) + "\n" for row in rows)
    log.info("Sweep results (%s):\n%s", sweep_dir / "sweep_results.csv", format_table(rows, columns))


def format_table(rows: List[Dict[str, Any]], columns: List[str]) -> str:
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]
    lines = [columns, *cells]
    return "\n".join("  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() for line in lines)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4f}" if isinstance(value, float) else str(value)
