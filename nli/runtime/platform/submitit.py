"""Slurm (and submitit's local executor) through ``hydra/launcher=submitit_*``: one process per task,
placed by submitit's job environment; submitit requeues a job on its preemption signal (USR2
unless ``SUBMITIT_PREEMPT_SIGNAL`` names another), once the run has written its checkpoint."""

from __future__ import annotations

import random
import signal
from typing import Dict, Mapping, Optional

from nli.runtime.platform.local import Local


class Submitit(Local):
    name = "submitit"

    def applies(self, env: Mapping[str, str]) -> bool:
        return bool(env.get("SUBMITIT_EXECUTOR"))

    def process_env(self, env: Mapping[str, str]) -> Optional[Dict[str, str]]:
        from submitit import JobEnvironment  # only under submitit

        # Its TorchDistributedEnvironment is not used: it draws the port among the ephemeral ones (PORTS), and
        # its export() would also narrow CUDA_VISIBLE_DEVICES.
        job = JobEnvironment()
        if job.num_tasks <= 1:
            return None
        return {"MASTER_ADDR": job.hostnames[0], "MASTER_PORT": rendezvous_port(job.job_id, env),
                "RANK": str(job.global_rank), "WORLD_SIZE": str(job.num_tasks), "LOCAL_RANK": str(job.local_rank),
                "LOCAL_WORLD_SIZE": str(job.num_tasks // job.num_nodes)}

    def requeue_signal(self, env: Mapping[str, str]) -> Optional[signal.Signals]:
        return signal.Signals[f"SIG{env.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}"]


# Below Linux's ephemeral ports (32768-60999 by default), which a node's outgoing connections hold at random:
# submitit draws from 20000-60000, and a port in use stops the job (seen on a busy machine).
PORTS = range(20000, 32768)


def rendezvous_port(job_id: str, env: Mapping[str, str]) -> str:
    """The job's rendezvous port: ``MASTER_PORT`` where the job's environment sets one, else drawn from the
    job's id, the same on every task, from :data:`PORTS`."""
    return env.get("MASTER_PORT") or str(random.Random(job_id).choice(PORTS))


SUBMITIT = Submitit()
