"""The recipes of conf/experiment/ against the dev figures their authors published.

    python -m benchmarks.recipes                                  # the table and each command; runs nothing
    python -m benchmarks.recipes --run deberta-v3-base-mnli --hw a100
    python -m benchmarks.recipes --run all --hw a100 --out reproduced
    python -m benchmarks.recipes --run electra-large-small-tasks --tasks rte -- data.dir=glue_data

Each run is ``train.py experiment=<recipe> task=<task> hw=<hw>`` (plus any overrides after ``--``) in
``<out>/<recipe>/<task>``; a run folder that already finished answers from its results.json, so the
command can be started again after an interruption. Printed: published, ours and the difference,
in points. The runs need the Hub (checkpoints, GLUE) and a GPU: none has run for this project yet.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Published:
    recipe: str  # conf/experiment/<recipe>.yaml
    task: str  # task=<task>
    figures: Dict[str, float]  # results.json key -> the published dev figure, in percent
    source: str  # where the figure is published

    def command(self, hw: str, overrides: List[str]) -> List[str]:
        return ["python", "train.py", f"experiment={self.recipe}", f"task={self.task}", f"hw={hw}", *overrides]


_ROBERTA = "Liu et al. 2019 (RoBERTa), Table 5"
_DEBERTA = "microsoft/DeBERTa README (DeBERTa-v3)"
_ELECTRA = "google-research/electra README, median of many seeds"
_LORA = "Hu et al. 2021 (LoRA), Table 2"
PUBLISHED = [
    Published("roberta-large-mnli", "mnli", {"accuracy": 90.2, "accuracy_mm": 90.2}, _ROBERTA),
    Published("roberta-large-from-mnli", "rte", {"accuracy": 86.6}, _ROBERTA),
    Published("roberta-large-from-mnli", "mrpc", {"accuracy": 90.9}, _ROBERTA),
    Published("deberta-v3-xsmall-mnli", "mnli", {"accuracy": 88.1, "accuracy_mm": 88.3}, _DEBERTA),
    Published("deberta-v3-small-mnli", "mnli", {"accuracy": 88.3, "accuracy_mm": 87.7}, _DEBERTA),
    Published("deberta-v3-base-mnli", "mnli", {"accuracy": 90.6, "accuracy_mm": 90.7}, _DEBERTA),
    Published("deberta-v3-large-mnli", "mnli", {"accuracy": 91.8, "accuracy_mm": 91.9}, _DEBERTA),
    Published("electra-base-mnli", "mnli", {"accuracy": 88.8}, _ELECTRA),
    Published("electra-large-mnli", "mnli", {"accuracy": 90.9}, _ELECTRA),
    Published("electra-large-small-tasks", "rte", {"accuracy": 88.0}, _ELECTRA),
    Published("electra-large-small-tasks", "mrpc", {"accuracy": 90.8}, _ELECTRA),
    Published("electra-large-small-tasks", "stsb", {"spearmanr": 92.6}, _ELECTRA),
    Published("lora-roberta-base-mnli", "mnli", {"accuracy": 87.5}, _LORA),
]


def selected(recipes: List[str], tasks: Optional[List[str]]) -> List[Published]:
    """The rows of ``recipes`` (``all``: every row), only of ``tasks`` if given."""
    known = sorted({row.recipe for row in PUBLISHED})
    unknown = [name for name in recipes if name != "all" and name not in known]
    if unknown:
        raise SystemExit(f"no published figures for {unknown}; recipes with figures: {', '.join(known)}")
    rows = [row for row in PUBLISHED if "all" in recipes or row.recipe in recipes]
    rows = [row for row in rows if tasks is None or row.task in tasks]
    if not rows:
        raise SystemExit(f"none of {recipes} has published figures for the tasks {tasks}")
    return rows


def run(row: Published, *, hw: str, overrides: List[str], out: Path) -> Dict[str, float]:
    """One recipe on one task, through train.py; its results.json."""
    folder = out / row.recipe / row.task
    command = [sys.executable, *row.command(hw, overrides)[1:], f"hydra.run.dir={folder}", "train.progress_bar=false"]
    print(f"running: {shlex.join(command[1:])}", flush=True)
    proc = subprocess.run(command, cwd=ROOT, env=dict(os.environ), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{row.recipe} on {row.task} failed (its log: {folder}/train.log):\n{proc.stderr[-3000:]}")
    return dict(json.loads((folder / "results.json").read_text()))


def table(rows: List[Published], results: Dict[int, Dict[str, float]]) -> str:
    """Published against ours where a row ran, in points (results.json holds fractions)."""
    lines = ["| recipe | task | metric | published | ours | difference | source |", "|---|---|---|---:|---:|---:|---|"]
    for i, row in enumerate(rows):
        for key, figure in row.figures.items():
            ours = results.get(i, {}).get(key)
            measured = f"{100 * ours:.1f}" if ours is not None else "not run"
            delta = f"{100 * ours - figure:+.1f}" if ours is not None else ""
            lines.append(f"| {row.recipe} | {row.task} | {key} | {figure:.1f} | {measured} | {delta} | {row.source} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", nargs="+", metavar="RECIPE", help="recipes to run (all: every one)")
    parser.add_argument("--tasks", nargs="+", help="only these tasks of the recipes")
    parser.add_argument("--hw", default="auto", help="the hw= preset of each run (default: auto)")
    parser.add_argument("--out", type=Path, default=Path("reproduced"), help="the runs' folders (default: reproduced)")
    parser.add_argument("--json", type=Path, help="also write every run's results here")
    parser.add_argument("overrides", nargs="*", help="after --: overrides for every run, e.g. data.dir=glue_data")
    args = parser.parse_args()
    rows = selected(args.run or ["all"], args.tasks)
    if not args.run:
        print(table(rows, {}))
        print("\nCommands (each needs the Hub and, in reasonable time, a GPU):")
        for row in rows:
            print("  " + shlex.join(row.command(args.hw, args.overrides)))
        return
    results = {i: run(row, hw=args.hw, overrides=args.overrides, out=args.out.resolve()) for i, row in enumerate(rows)}
    print(table(rows, results))
    if args.json:
        args.json.write_text(json.dumps([{"recipe": row.recipe, "task": row.task, "published": row.figures,
                                          "results": results[i]} for i, row in enumerate(rows)], indent=2) + "\n")


if __name__ == "__main__":
    main()
