"""Slurm (and submitit's local executor) through ``hydra/launcher=submitit_*``: one process per task,
placed by submitit's job environment; submitit requeues a job on its preemption signal (USR2
unless ``SUBMITIT_PREEMPT_SIGNAL`` names another), once the run has written its checkpoint."""

from __future__ import annotations

import signal
from typing import Dict, Mapping, Optional

from nli.runtime.platform.local import Local


class Submitit(Local):
    name = "submitit"

    def applies(self, env: Mapping[str, str]) -> bool:
        return bool(env.get("SUBMITIT_EXECUTOR"))

    def process_env(self, env: Mapping[str, str]) -> Optional[Dict[str, str]]:
        from submitit.helpers import TorchDistributedEnvironment  # only under submitit

        # Read, not exported: its export() would also narrow CUDA_VISIBLE_DEVICES.
        job = TorchDistributedEnvironment()
        if job.world_size <= 1:
            return None
        return {"MASTER_ADDR": job.master_addr, "MASTER_PORT": str(job.master_port), "RANK": str(job.rank),
                "WORLD_SIZE": str(job.world_size), "LOCAL_RANK": str(job.local_rank),
                "LOCAL_WORLD_SIZE": str(job.local_world_size)}

    def requeue_signal(self, env: Mapping[str, str]) -> Optional[signal.Signals]:
        return signal.Signals[f"SIG{env.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}"]


SUBMITIT = Submitit()
