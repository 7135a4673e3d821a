"""How the tests run the project.

- :func:`run_app`: ``python train.py ARGS`` in this process: the real entry (``--help``, Hydra's
  composition, its run directory, ``.hydra/`` and ``train.log``, the task function, the run), with the
  exit status, standard output and error a process would give. Torch and transformers load once per
  test process instead of once per run.
- :func:`run_process`: the same command in a new process, where the process itself is under test
  (signals, SIGKILL, torchrun, submitit, Vertex AI jobs, ``python -m nli``, the checks that answer
  before torch loads). Tests that start one carry the ``process`` marker.
- :func:`finished_run` (the ``shared_run`` fixture): a run that several tests read, trained once per
  test session whatever the number of xdist workers; a test that changes a folder works on a copy
  (:func:`copy_run`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

from filelock import FileLock
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

import train  # the repository's train.py: Hydra's main, as `python train.py` runs it
from nli.cli import entry

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
GLUE_DATA = ROOT / "tests" / "data" / "glue_data"  # real RTE and WNLI, in GLUE's layout (tests/data/README.md)

# What a run measures rather than computes, and where it ran (its command, threads, code: nli.runtime.provenance):
# the only results that differ between equal runs.
MEASURED = {"train_examples_per_second", "train_tokens_per_second", "train_seconds", "peak_memory_bytes",
            "eval_examples_per_second", "provenance"}
# A few hundred synthetic examples and a handful of steps: about a second per run on one CPU core.
FAST = ["experiment=quickstart", "data.synthetic_train_size=320", "data.synthetic_eval_size=96",
        "train.max_steps=12", "train.eval_every=6", "train.log_every=3", "train.progress_bar=false"]


def environment_python(variable: str, default: Path, *, what: str, build: str) -> str:
    """The Python of another environment the tests run the project in (``what``, made by ``build``): ``variable``
    names it, else ``default``; a test without it fails, saying how to make it."""
    import pytest

    python = os.environ.get(variable) or str(default)
    if not Path(python).exists():
        pytest.fail(f"no {what} at {python}: build it with `{build}`, or point {variable} at the Python of one")
    return python


def run_app(args: Sequence[str], *, cwd: Path, env: Optional[Mapping[str, Optional[str]]] = None
            ) -> subprocess.CompletedProcess:
    """``python train.py ARGS`` run in this process from ``cwd``, with ``env`` over the environment for
    its duration (None: the variable unset). Returns what a process would: the exit status (0, 1 for an
    error, 75 for a stop), its standard output (the log) and its standard error."""
    out, err = io.StringIO(), io.StringIO()
    with _environment({"HYDRA_FULL_ERROR": "0", **(env or {})}), _working_directory(cwd), _own_hydra(), \
            _own_logging(), _own_wandb(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            _argv(["train.py", *args]):
        try:
            entry(train.main, CONF, list(args))
            status = 0
        except SystemExit as stop:
            status = _status(stop, err)
    return subprocess.CompletedProcess(["train.py", *args], status, out.getvalue(), err.getvalue())


def run_process(args: Sequence[str], *, cwd: Path, module: bool = False, timeout: float = 600,
                env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """``python train.py ARGS`` (or ``python -m nli ARGS``) in a new process, as a user types it."""
    entry = ["-m", "nli"] if module else [str(ROOT / "train.py")]
    return subprocess.run([sys.executable, *entry, *args], cwd=cwd, env=process_env(env), capture_output=True,
                          text=True, timeout=timeout)


def read_line(stream: Optional[IO[str]], timeout: float = 60.0) -> str:
    """The next line a process writes on ``stream`` (its stdout, a pipe); a failure after ``timeout`` seconds
    rather than a suite that waits for ever on a process that never writes it."""
    assert stream is not None, "the process's output is not a pipe"
    line: List[str] = []
    reader = threading.Thread(target=lambda: line.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)  # a reader left waiting ends when the test kills the process: readline sees the end
    assert line, f"no line from the process within {timeout:g} s"
    return line[0]


def process_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment of a process a test starts: the suite's own (tests/conftest.py), and ``env``; not the
    address of a W&B service this process may have started (WANDB_SERVICE: a new process starts its own)."""
    inherited = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}
    return {**inherited, "HYDRA_FULL_ERROR": "0", **(env or {})}


def read_results(output_dir: Path) -> Dict[str, Any]:
    return json.loads((output_dir / "results.json").read_text())


def shared_folder(root: Path, name: str, how: Sequence[str], make: Callable[[Path], None]) -> Path:
    """The folder ``make(folder)`` fills, under ``root`` (shared by the session's workers): made by the
    first test that asks, under a lock; the others wait for it and read it. ``how`` (the command) must
    be the same for every test that asks for ``name``."""
    root.mkdir(parents=True, exist_ok=True)
    folder, done = root / name, root / f"{name}.done.json"
    with FileLock(str(root / f"{name}.lock")):
        if done.exists():
            assert json.loads(done.read_text()) == list(how), f"two tests share {name}, made in other ways"
        else:
            shutil.rmtree(folder, ignore_errors=True)
            make(folder)
            done.write_text(json.dumps(list(how)))
    return folder


def finished_run(root: Path, name: str, args: Sequence[str]) -> Path:
    """The folder of a run of ``args`` that finished (:func:`shared_folder`), run in this process."""

    def make(folder: Path) -> None:
        proc = run_app([*args, f"hydra.run.dir={folder}"], cwd=root)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    return shared_folder(root, name, args, make)


def copy_run(folder: Path, into: Path) -> Path:
    """A copy of a finished run's folder, for a test that changes it."""
    shutil.copytree(folder, into)
    return into


def _status(stop: SystemExit, err: io.StringIO) -> int:
    """The exit status of ``raise SystemExit(code)``, its message written as Python writes it."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=err)
    return 1


@contextlib.contextmanager
def _environment(env: Mapping[str, Optional[str]]) -> Iterator[None]:
    """``env`` over the environment while the run lasts; afterwards the environment as it was, whatever
    the run set (a process's environment dies with it)."""
    saved = dict(os.environ)
    try:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _working_directory(cwd: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _own_hydra() -> Iterator[None]:
    """Hydra's global state as a new process has it (none), and the test session's back afterwards."""
    hydra, config = GlobalHydra.instance().hydra, HydraConfig.instance().cfg
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None  # type: ignore[assignment]
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        if hydra is not None:
            GlobalHydra.instance().initialize(hydra)
        HydraConfig.instance().cfg = config  # type: ignore[assignment]


@contextlib.contextmanager
def _own_logging() -> Iterator[None]:
    """Hydra configures logging for each run (the console and train.log): afterwards the test session's
    handlers come back, and the run's are closed, its train.log among them."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


@contextlib.contextmanager
def _own_wandb() -> Iterator[None]:
    """W&B reads its settings (WANDB_* variables, its settings files) once per process, and keeps its
    service's address in WANDB_SERVICE: each run starts with neither, as a new process would (a service that
    something else in this process started may be gone), and ends by tearing W&B's process state down."""
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        wandb.teardown()
    os.environ.pop("WANDB_SERVICE", None)
    try:
        yield
    finally:
        wandb = sys.modules.get("wandb")
        if wandb is not None:
            wandb.teardown()


@contextlib.contextmanager
def _argv(argv: List[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


def slurm_commands(folder: Path) -> Path:
    """``folder`` with an ``srun`` in it, for PATH: what the check looks for on a Slurm login node (it runs
    nothing)."""
    srun = folder / "srun"
    srun.parent.mkdir(parents=True, exist_ok=True)
    srun.write_text("#!/bin/sh\nexit 1\n")
    srun.chmod(0o755)
    return folder
