"""The GPU check: what this project has never done on a GPU, done in one short run on one, each line
reported pass, fail or skipped with its figures and its time, as JSON and Markdown.

The GPU machines it is meant for are offline and short-lived (minutes), with torch, transformers and
most of their company preinstalled but no Hydra and no datasets. So it comes in two commands:

    python -m benchmarks.gpu_check prepare              # here, with the package index: the kit, into .gpu-kit/
    python3 -m benchmarks.gpu_check run --out gpu-check    # there, from the repository root, offline

``prepare`` downloads the wheels that requirements/gpu-check.txt pins (``--python-version`` for another
Python; 3.12 is the GPU machines') and prints their sizes. ``run`` installs them into the kit with pip
(no index, no dependencies; unpacked by hand where pip is missing) and runs every line, each in processes of its
own with a time limit, stopped whole (SIGTERM, then SIGKILL, torchrun's workers too) past it, so that a line that
fails or hangs costs only itself; all of it within ``--budget`` seconds (450: for a device call of about 590 s),
after which lines read "skipped: out of time". The report, at most five files straight in ``--out``
(:data:`REPORT_FILES`), is rewritten as each line ends, so what finished is there even if the machine is taken
back, and a SIGTERM to the check stops its sub-runs and writes it. ``--device cpu`` rehearses the lines a CPU
can run (the GPU-only ones are reported "skipped: no GPU", never passed):

    python -m benchmarks.gpu_check run --out gpu-check --device cpu --only quickstart_bf16 eval_only resume

Lines: the quickstart in bf16 and fp16; ``train.compile=true`` and its recompilations; an
evaluation-only run of a run folder with and without the fast paths; SIGTERM and resume against
unbroken runs; a CUDA out-of-memory backed off into smaller micro-batches; torchrun with one process;
the synthetic roberta-large benchmark against the tuned Trainer (tokens/s, MFU), again at 512 pairs a
step, and ours with DataLoader workers and without; every GPU hw preset x
recipe (benchmarks.memory's enumeration) measured against its card's memory; an fp16-stored checkpoint
trained in bf16 and fp16; gradient checkpointing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict

# Nothing heavy here or in the modules: the parent process must start before the kit is installed (no Hydra yet)
# and must not hold the GPU (no torch.cuda here); every measurement runs in a child process.

STARTED = time.monotonic()  # the check's clock: its --budget counts from here, the kit's install and start-up in it
ROOT = Path(__file__).resolve().parents[2]  # the repository: the check runs from its root
Figures = Dict[str, Any]
