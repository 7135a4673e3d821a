"""The platform seam: each platform's module answers the run's questions from the environment it sets,
the most specific first, and nothing else in the project reads a platform's variables."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Dict

import pytest
import yaml

from nli.contract import vertex_dirs
from nli.runtime import platform
from nli.runtime.platform.submitit import PORTS, SUBMITIT
from tests.support.runs import FAST, ROOT, read_results, run_app

SPEC = {"cluster": {"workerpool0": ["primary:2222"], "workerpool1": ["w1:2222", "w2:2222"]},
        "task": {"type": "workerpool1", "index": 1}}


def test_on_this_machine_nothing_is_answered() -> None:
    site = platform.detect({})
    assert site.platforms == ("local",)
    assert site.process_env == {} and site.requeue_signal is None
    assert (site.output_dir, site.checkpoint_dir, site.log_dir) == (None, None, None)


def test_a_vertex_ai_replica_gets_its_job_directories_and_its_place() -> None:
    env = {**vertex_dirs("gs://bucket/sweep/3"), "CLUSTER_SPEC": json.dumps(SPEC)}
    site = platform.detect(env)
    assert site.platforms == ("vertex", "local")
    assert site.output_dir == "gs://bucket/sweep/3/model"
    assert site.checkpoint_dir == "gs://bucket/sweep/3/checkpoints"
    assert site.log_dir == "gs://bucket/sweep/3/logs"
    # workerpool1's replica 1 is the third of three machines, one process each.
    assert site.process_env == {"MASTER_ADDR": "primary", "MASTER_PORT": "2222", "NODE_RANK": "2", "WORLD_SIZE": "3",
                                "RANK": "2", "LOCAL_RANK": "0"}


def test_torchrun_inside_a_vertex_job_places_the_processes_and_vertex_names_the_outputs() -> None:
    torchrun = {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "MASTER_ADDR": "primary", "MASTER_PORT": "2222"}
    site = platform.detect({**torchrun, **vertex_dirs("gs://b/j"), "CLUSTER_SPEC": json.dumps(SPEC)})
    assert site.platforms == ("torchrun", "vertex", "local")
    assert site.process_env == torchrun and site.output_dir == "gs://b/j/model"


def test_a_single_vertex_replica_is_one_process() -> None:
    alone = {"cluster": {"workerpool0": ["host:1"]}, "task": {"type": "workerpool0", "index": 0}}
    assert platform.detect({"CLUSTER_SPEC": json.dumps(alone)}).process_env == {}


def test_submitit_requeues_on_its_own_signal() -> None:
    assert SUBMITIT.requeue_signal({"SUBMITIT_EXECUTOR": "slurm"}) is signal.SIGUSR2
    assert SUBMITIT.requeue_signal({"SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_PREEMPT_SIGNAL": "USR1"}) is signal.SIGUSR1
    assert not SUBMITIT.applies({})


def submitit_task(monkeypatch: pytest.MonkeyPatch, job_id: str, rank: int, tasks: int = 2) -> Dict[str, str]:
    """The process environment of task ``rank`` of a job of submitit's local executor (which sets what its Slurm
    executor's job environment reads from Slurm)."""
    env = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": job_id, "SUBMITIT_LOCAL_NTASKS": str(tasks),
           "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_GLOBALID": str(rank),
           "SUBMITIT_LOCAL_LOCALID": str(rank)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return SUBMITIT.process_env(os.environ) or {}


def test_a_submitit_jobs_tasks_meet_on_one_port_below_the_ephemeral_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every task of a job draws the same port from its id, below Linux's ephemeral ports (32768-60999), which
    outgoing connections hold: submitit's own draw (20000-60000) once met one in use."""
    monkeypatch.delenv("MASTER_PORT", raising=False)
    ports = set()
    for job in map(str, range(1000, 1050)):
        first, second = submitit_task(monkeypatch, job, 0), submitit_task(monkeypatch, job, 1)
        assert first["MASTER_PORT"] == second["MASTER_PORT"] and int(first["MASTER_PORT"]) in PORTS
        assert (first["RANK"], second["RANK"], first["WORLD_SIZE"], second["LOCAL_WORLD_SIZE"]) == ("0", "1", "2", "2")
        ports.add(first["MASTER_PORT"])
    assert len(ports) > 40  # drawn by the job's id: jobs on one node rarely meet
    monkeypatch.setenv("MASTER_PORT", "29555")  # the job's environment names one: taken as it is
    assert submitit_task(monkeypatch, "7", 1)["MASTER_PORT"] == "29555"
    assert submitit_task(monkeypatch, "7", 0, tasks=1) == {}  # one task: no process group


def test_no_platform_variable_is_read_outside_the_seam() -> None:
    """AIP_*, CLUSTER_SPEC and SUBMITIT_* are named in nli/runtime/platform/ and nli/contract.py only: a new
    platform touches no other file, and conf/ names none."""
    pattern = re.compile(r"(?<![A-Z_])(AIP_[A-Z_]+|CLUSTER_SPEC|SUBMITIT_[A-Z_]+)")
    allowed = {ROOT / "nli" / "contract.py", *(ROOT / "nli" / "runtime" / "platform").glob("*.py")}
    readers = [str(path.relative_to(ROOT)) for path in [*(ROOT / "nli").rglob("*.py"), *(ROOT / "launch").rglob("*.py"),
                                                         *(ROOT / "conf").rglob("*.yaml")]
               if path not in allowed and pattern.search(re.sub(r'""".*?"""|#.*', "", path.read_text(), flags=re.S))]
    assert not readers


def test_a_run_writes_where_the_platform_says(tmp_path: Path) -> None:
    """On Vertex AI (its variables, here pointing at local folders) the outputs and checkpoints go to the
    job's directories, not the Hydra run directory; config.yaml records where."""
    base = tmp_path / "job"
    proc = run_app([*FAST, f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=tmp_path,
                   env=vertex_dirs(str(base)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_results(base / "model")["status"] == "completed"
    assert sorted(p.name for p in (base / "checkpoints").iterdir()) == ["step-000006", "step-000012"]
    saved = yaml.safe_load((base / "model" / "config.yaml").read_text())
    assert saved["output_dir"] == str(base / "model") and saved["train"]["checkpoint_dir"] == str(base / "checkpoints")
    assert not (tmp_path / "hydra" / "results.json").exists()
