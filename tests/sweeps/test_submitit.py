"""Sweeps through hydra-submitit-launcher. `submitit_local` runs each job as submitit runs it on
Slurm (a pickled task function, unpickled and called in a fresh process, under submitit's own
signal handlers), so it stands in for `submitit_slurm` where there is no cluster."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest
from omegaconf import OmegaConf

from nli.config import command
from tests.support.runs import CONF, FAST, ROOT, process_env, read_results, run_app, slurm_commands

SHORT = [arg for arg in FAST if not arg.startswith("train.max_steps=")]


@pytest.mark.process
def test_submitit_local_sweep_and_a_requeue_that_resumes(tmp_path: Path) -> None:
    """Two jobs; the longer one gets submitit's preemption signal (USR2, as Slurm sends it before a time
    limit): it checkpoints at the step, submitit requeues it, and the requeued job continues from there."""
    sweep = tmp_path / "sweep"
    # timeout_min: a stuck job fails the test instead of hanging it (submitit kills it).
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=submitit_local", *SHORT,
         "train.max_steps=12,90", f"hydra.sweep.dir={sweep}", "hydra.launcher.timeout_min=10"],
        cwd=tmp_path, env=process_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        pid = _wait_for_log(sweep, "step 15:", timeout=300)  # only the 90-step job gets that far
        # A local job is a controller process running the task as its child; Slurm signals the task.
        task = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        os.kill(task, signal.SIGUSR2)
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]

    steps = []
    for job in ("0", "1"):
        out = sweep / job
        results = read_results(out)  # output_dir resolved to the job's own directory
        assert isinstance(results["objective"], float)
        assert OmegaConf.load(out / "config.yaml").output_dir == str(out)
        steps.append(results["train_steps"])
    assert steps == [12, 90]

    log = next(text for text in (path.read_text() for path in (sweep / ".submitit").glob("*/*_log.*"))
               if "SIGUSR2 received" in text)
    received, handed = log.index("SIGUSR2 received"), log.index("handing SIGUSR2 over to the platform")
    resumed = int(re.search(r"resuming from checkpoint \S+: step (\d+) of 90", log)[1])
    assert f"step {resumed}: checkpoint written" in log[received:handed]  # the stop's own checkpoint
    assert "Requeued job" in log[handed:]
    # submitit's own files: per job, the pickled call, its result and a log that says it completed.
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 2


def _wait_for_log(sweep: Path, text: str, timeout: float) -> int:
    """The pid of the submitit job whose log shows ``text`` (a local job's id is its pid)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in (sweep / ".submitit").glob("*/*_log.*"):
            if text in log.read_text(errors="replace"):
                return int(log.parent.name)
        time.sleep(0.2)
    raise TimeoutError(f"no job logged {text!r} within {timeout} s")


def test_slurms_launcher_on_a_machine_without_slurm_is_refused_before_any_folder(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    """submitit looks for srun as the sweep starts: on a workstation its RuntimeError came as a traceback, after
    Hydra had made the sweep's folder. Now one line, nothing made; on a machine with srun the check lets it by."""
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no srun there; the run needs nothing else from PATH
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=submitit_slurm", *FAST, "seed=1,2", f"hydra.sweep.dir={sweep}"]
    proc = run_app(args, cwd=tmp_path)
    assert proc.returncode == 1 and not sweep.exists(), proc.stdout + proc.stderr
    assert proc.stderr == ("error: hydra/launcher=submitit_slurm submits the sweep's jobs to Slurm, and this machine "
                           "has none (no srun on PATH): run the command on the cluster's login node, or try the sweep "
                           "here with hydra/launcher=submitit_local, which runs its jobs as Slurm would "
                           "(docs/slurm.md)\n")
    slurm_commands(tmp_path / "bin")
    assert command.check(args, CONF, "train").extra == []  # the check lets it by: submitit submits from here



@pytest.mark.parametrize("asked", [["hydra.launcher.gpus_per_node=2"], ["hydra.launcher.gres=gpu:v100:2"],
                                   ["+hydra.launcher.additional_parameters.gpus=2"]])
def test_a_slurm_sweep_on_gpus_that_asks_slurm_for_none_is_refused_before_any_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: List[str]) -> None:
    """sbatch asks for no GPU unless the launcher says: each job of ``hw=2xv100`` waited in the queue for a machine,
    then stopped there, refusing a GPU preset on a machine without one."""
    monkeypatch.setenv("PATH", f"{slurm_commands(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=submitit_slurm", "model=tiny", "task=synthetic", "hw=2xv100", "seed=1,2",
            f"hydra.sweep.dir={sweep}"]
    with pytest.raises(SystemExit, match=r"^error: hw=2xv100 trains on 2 GPU\(s\) per machine, and the launcher "
                                         r"asks Slurm for none \(hydra.launcher.gpus_per_node is unset\): .* Add "
                                         r"hydra.launcher.gpus_per_node=2 \(docs/slurm.md\)$"):
        command.check(args, CONF, "train")
    assert not sweep.exists()
    assert command.check([*args, *asked], CONF, "train").extra == []
