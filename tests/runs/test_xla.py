"""The PyTorch/XLA path (hw=tpu-*), on XLA's CPU device: the real train.py, run by the Python of the
environment that has torch-xla (``bash .ci/xla-env`` builds it; NLI_XLA_PYTHON names another), with
PJRT_DEVICE=CPU. The same code runs on a TPU, where PJRT_DEVICE=TPU.

    bash .ci/xla-env && python -m pytest -m xla

Marked ``xla``: the default run leaves them out (its size: .ci/xla-env's header); CI runs them (.ci/run).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch
from safetensors.torch import load

from nli.data.loaders import bucket_lengths
from tests.runs.test_signals import logged, wait_for
from tests.support.runs import MEASURED, ROOT, environment_python, process_env, read_results

pytestmark = [pytest.mark.xla, pytest.mark.process]  # each test starts train.py in the XLA environment

# What differs between equal runs on XLA besides what any run measures: a resumed run compiles its
# graphs again.
XLA_MEASURED = MEASURED | {"xla_compilations", "xla_compile_seconds"}
# The quickstart on the one-chip TPU preset; 6,000 examples, 2 epochs of 188 steps, evaluated at each end.
QUICKSTART = ["experiment=quickstart", "hw=tpu-v5e-1", "train.progress_bar=false"]
# 20 steps per epoch, 50 in all: the signal lands in the second epoch (as in test_resume).
SHORT = ["experiment=quickstart", "hw=tpu-v5e-1", "data.synthetic_train_size=640", "data.synthetic_eval_size=96",
         "train.max_steps=50", "train.eval_every=15", "train.log_every=1", "train.checkpoint_every=5",
         "train.progress_bar=false"]


@pytest.fixture(scope="session")
def xla_python() -> str:
    return environment_python("NLI_XLA_PYTHON", ROOT / ".venv-xla" / "bin" / "python", what="PyTorch/XLA environment",
                              build="bash .ci/xla-env")


def command(xla_python: str, args: List[str], run_dir: Path, *, launcher: bool = False,
            env: Dict[str, str] | None = None) -> Tuple[List[str], Dict[str, str]]:
    """train.py, or with ``launcher`` PyTorch/XLA's launcher as a TPU host runs it (nli.node on PJRT_DEVICE=TPU):
    ``python -m nli.xla_launch``, one process per device (one on XLA's CPU device)."""
    full_env = process_env({"PJRT_DEVICE": "CPU", **(env or {})})
    entry = ["-m", "nli.xla_launch"] if launcher else [str(ROOT / "train.py")]
    return [xla_python, *entry, *args, f"hydra.run.dir={run_dir}"], full_env


def train(xla_python: str, args: List[str], run_dir: Path, *, launcher: bool = False) -> subprocess.CompletedProcess:
    argv, env = command(xla_python, args, run_dir, launcher=launcher)
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def logged_compilations(run_dir: Path) -> Dict[int, int]:
    """Step -> the graphs compiled by then, from the training log's lines."""
    lines = (run_dir / "train.log").read_text()
    return {int(step): int(float(count)) for step, count in
            re.findall(r"step (\d+): loss=.*xla_compilations=([\d.]+)", lines)}


@pytest.fixture(scope="module")
def quickstart(xla_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("xla") / "quickstart"
    train(xla_python, QUICKSTART, run_dir)
    return run_dir


def test_the_quickstart_trains_on_xla_to_the_cpu_band(quickstart: Path) -> None:
    results = read_results(quickstart)
    assert results["accuracy"] > 0.85  # the quickstart's band on the CPU (conf/experiment/quickstart.yaml)
    assert results["train_steps"] == 376
    log = (quickstart / "train.log").read_text()
    assert "device: xla:0 (CPU through PyTorch/XLA" in log and "precision bf16" in log  # precision=auto on XLA
    assert "fast paths: first_token" in log  # the CPU-only ones stay off
    assert (quickstart / "model" / "model.safetensors").exists()


def test_the_second_epoch_compiles_no_new_graph(quickstart: Path) -> None:
    compiled = logged_compilations(quickstart)
    first_epoch_done = min(step for step in compiled if step > 188)  # after the first evaluation, at step 188
    # Up to the step before the last: the last (376, logged since the last step always logs) is the one whose
    # learning rate the linear schedule brings to 0, and XLA compiles that step's graph once more (not so under
    # schedule=constant, measured), whatever the shapes.
    before_last = max(step for step in compiled if step < 376)
    assert compiled[before_last] == compiled[first_epoch_done], compiled
    assert compiled[376] <= compiled[before_last] + 1, compiled
    # One graph per phase (the forward and backward pass, the optimizer step, evaluation) for each bucket
    # length and batch size (a full batch, the epoch's last): padding to each batch's own longest sequence
    # would compile one per length.
    bound = 3 * len(bucket_lengths(64)) * 2
    results = read_results(quickstart)
    assert 0 < compiled[max(compiled)] <= results["xla_compilations"] <= bound + 3 * 2, compiled  # + the export's
    assert re.search(r"XLA compiled \d+ graphs in [\d.]+ s", (quickstart / "train.log").read_text())


def outcome(run_dir: Path) -> Tuple[Dict, Dict[str, torch.Tensor]]:
    results = {k: v for k, v in read_results(run_dir).items() if k not in XLA_MEASURED}
    return results, load((run_dir / "model" / "model.safetensors").read_bytes())


def test_sigterm_then_resume_ends_where_an_uninterrupted_run_does(xla_python: str, tmp_path: Path) -> None:
    """The stopped run under the launcher a TPU host uses: the signal reaches the launcher alone, which passes it
    on to its process, where the run is in a thread of PyTorch/XLA's (nli.runtime.signals.relay_to_threads)."""
    whole = tmp_path / "whole"
    train(xla_python, SHORT, whole)

    stopped = tmp_path / "stopped"
    argv, env = command(xla_python, SHORT, stopped, launcher=True)
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(proc, logged(stopped, "step 23: loss"), timeout=600)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-3000:]
    stopped_at = int(re.search(r"preempted, resumable: SIGTERM at step (\d+)", err)[1])
    assert 23 <= stopped_at < 50

    resumed = train(xla_python, SHORT, stopped, launcher=True)
    assert f"step {stopped_at} of 50" in resumed.stdout
    (ours, our_weights), (theirs, their_weights) = outcome(stopped), outcome(whole)
    assert ours == theirs
    assert our_weights.keys() == their_weights.keys()
    for name, tensor in their_weights.items():
        assert torch.equal(our_weights[name], tensor), name


def test_a_tpu_whose_cores_are_threads_is_refused_at_start(xla_python: str, tmp_path: Path) -> None:
    """Two XLA devices in one process, as PyTorch/XLA gives a v2/v3 chip's two cores (here XLA's CPU device,
    CPU_NUM_DEVICES=2): one line naming the TPUs that work, before any data or model loads."""
    argv, env = command(xla_python, ["experiment=quickstart", "hw=tpu-v3-8"], tmp_path / "run",
                        env={"CPU_NUM_DEVICES": "2"})
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "error: this process sees 2 XLA devices" in proc.stderr and "hw=tpu-v5e-8" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "checkpoints").exists()


def test_the_tpu_benchmark_prints_its_figures(xla_python: str, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    proc = subprocess.run([xla_python, "-m", "benchmarks.tpu", "--hw", "tpu-v5e-1", "--arch", "tiny", "--steps", "20",
                           "--examples", "640", "--seq-len", "64", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env=process_env({"PJRT_DEVICE": "CPU"}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["examples_per_second"] > 0 and 0 < figures["xla_compilations"] <= 24
    assert 10 < figures["tokens_per_example"] <= 64  # MNLI's lengths, cut at 64
    assert "mfu" not in figures  # no TPU peak applies to XLA's CPU device
    assert f"| tokens per example | {figures['tokens_per_example']:.1f} |" in proc.stdout
    assert f"| graphs compiled | {figures['xla_compilations']} |" in proc.stdout


@pytest.mark.parametrize("launcher", [False, True])
def test_without_a_tpu_a_tpu_preset_stops_and_says_how_to_try_the_cpu(xla_python: str, tmp_path: Path,
                                                                      launcher: bool) -> None:
    """Left to itself, PyTorch/XLA falls back to the CPU where it finds no TPU; a TPU preset is refused instead,
    before anything loads, unless PJRT_DEVICE=CPU asks for that device (as every other test here does)."""
    argv, env = command(xla_python, ["experiment=quickstart", "hw=tpu-v5e-1"], tmp_path / "run", launcher=launcher)
    del env["PJRT_DEVICE"]
    if launcher:
        env["PJRT_DEVICE"] = "TPU"  # as the TPU image sets it
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "no TPU" in proc.stderr and "PJRT_DEVICE=CPU runs the XLA path on this machine's CPU" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "checkpoints").exists()


def test_under_the_launcher_a_signal_before_training_stops_the_run_and_saves_nothing(xla_python: str,
                                                                                     tmp_path: Path) -> None:
    """Outside the training steps the run, in PyTorch/XLA's thread, learns of the signal at its next phase check."""
    run_dir = tmp_path / "run"
    argv, env = command(xla_python, ["experiment=quickstart", "hw=tpu-v5e-1", "train.progress_bar=false"], run_dir,
                        launcher=True)
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(proc, logged(run_dir, "data: "), timeout=300)  # loading the data, before training
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-3000:]
    assert "stopped by SIGTERM before training began: nothing new was saved" in err and "Traceback" not in err
    assert not (run_dir / "checkpoints").exists()
