"""``python -m benchmarks.gpu_check prepare | run``, and the sub-commands its own sub-runs call."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional

import benchmarks.gpu_check as package
from benchmarks.gpu_check.kit import GPU_PYTHON, KIT, prepare
from benchmarks.gpu_check.probes import count_syncs, make_fp16_checkpoint
from benchmarks.gpu_check.runner import BUDGET, main_run, plan
from benchmarks.gpu_check.speed import measure_presets

LINES = tuple(name for name, *_ in plan())  # what --only takes


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=package.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="download the kit's wheels (here, with the package index)")
    prep.add_argument("--python-version", default=GPU_PYTHON, help=f"the Python they are for (default {GPU_PYTHON})")
    prep.add_argument("--kit", type=Path, default=KIT, help="writes KIT/wheels (default: .gpu-kit)")
    run = commands.add_parser("run", help="install the kit and run every line (there, offline)")
    run.add_argument("--out", type=Path, required=True, help="the report's folder (gpu_check.json, gpu_check.md)")
    run.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda where there is one; cpu: a rehearsal")
    run.add_argument("--kit", type=Path, default=KIT, help="where prepare put the wheels (default: .gpu-kit)")
    run.add_argument("--only", nargs="+", choices=LINES, help="these lines alone")
    run.add_argument("--work", type=Path, help="where the runs' folders go (default: the system's temporary "
                     "directory), apart from --out: checkpoints and weights are gigabytes")
    run.add_argument("--keep", action="store_true", help="keep the runs' folders (their path is in the report)")
    run.add_argument("--jobs", type=int, help="lines side by side on the device (default: 4 on a GPU, 1 on a CPU)")
    run.add_argument("--budget", type=float, default=BUDGET, help="seconds from the check's start (the kit's install "
                     "in them) after which no line starts, and the sub-runs still running are stopped, their lines "
                     f"'skipped: out of time' (default {BUDGET:.0f}: the whole check, its stop and report included, "
                     "in under 8 minutes, for a device call of about 10)")
    measure = commands.add_parser("measure-presets", help=argparse.SUPPRESS)
    measure.add_argument("--budget", type=float, default=180)
    make = commands.add_parser("make-fp16-checkpoint", help=argparse.SUPPRESS)
    make.add_argument("folder", type=Path)
    syncs = commands.add_parser("count-syncs", help=argparse.SUPPRESS)
    syncs.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.kit.resolve(), args.python_version)
        return 0
    if args.command == "measure-presets":
        measure_presets(args.budget)
        return 0
    if args.command == "make-fp16-checkpoint":
        make_fp16_checkpoint(args.folder)
        return 0
    if args.command == "count-syncs":
        count_syncs(args.folder)
        return 0
    if args.jobs is None:
        args.jobs = 4 if args.device != "cpu" else 1
    args.kit = args.kit.resolve()
    return main_run(args)

