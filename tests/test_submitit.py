"""Sweeps through hydra-submitit-launcher. `submitit_local` runs each job as submitit runs it on
Slurm (a pickled task function, unpickled and called in a fresh process, under submitit's own
signal handlers), so it stands in for `submitit_slurm` where there is no cluster."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from tests.conftest import FAST, read_results, run_train


def test_submitit_local_sweep(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    # timeout_min: a stuck job fails the test instead of hanging it (submitit kills it).
    proc = run_train(["-m", "hydra/launcher=submitit_local", *FAST, "seed=1,2", f"hydra.sweep.dir={sweep}",
                      "hydra.launcher.timeout_min=10"], cwd=tmp_path, env={"HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 0, proc.stderr[-3000:]

    seeds = []
    for job in ("0", "1"):
        out = sweep / job
        objective = read_results(out)["objective"]  # output_dir resolved to the job's own directory
        assert isinstance(objective, (int, float)) and not isinstance(objective, bool)
        config = OmegaConf.load(out / "config.yaml")
        assert config.output_dir == str(out)
        seeds.append(config.seed)
    assert sorted(seeds) == [1, 2]

    # submitit's own files: per job, the pickled call, its pickled result and a log that says it completed.
    logs = sorted((sweep / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 2 and all("Job completed successfully" in log.read_text() for log in logs)
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 2
