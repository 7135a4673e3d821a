"""The training image's entry point: ``python -m nli.node ARGS`` runs ``python -m nli ARGS`` once per
device of this machine, on every machine of the job.

One device (a CPU, one GPU) and one machine: the run itself, in this process's place. Several GPUs,
or several machines (Vertex AI's worker pools, described by ``CLUSTER_SPEC``): ``torchrun`` starts one
process per GPU and meets the other machines at the primary replica's address, so ``nli`` finds the
standard ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` variables it sets up its process group from.
"""

from __future__ import annotations

import json
import os
import sys
from typing import List, Mapping


def command(args: List[str], *, env: Mapping[str, str], gpus: int) -> List[str]:
    """The command line this machine runs: the run itself, or torchrun around it."""
    run = ["-m", "nli", *args]
    spec = json.loads(env["CLUSTER_SPEC"]) if env.get("CLUSTER_SPEC") else None
    pools = spec["cluster"] if spec else {}
    nodes = len(pools.get("workerpool0", [])) + len(pools.get("workerpool1", [])) or 1
    if nodes == 1 and gpus <= 1:
        return [sys.executable, *run]
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={max(gpus, 1)}"]
    if nodes == 1:
        return [*torchrun, "--standalone", *run]
    task = spec["task"]
    node_rank = 0 if task["type"] == "workerpool0" else int(task["index"]) + 1
    host, port = pools["workerpool0"][0].rsplit(":", 1)
    return [*torchrun, f"--nnodes={nodes}", f"--node-rank={node_rank}", f"--master-addr={host}",
            f"--master-port={port}", *run]


def main() -> None:
    import torch  # here, not at the top: the tests import command() without it

    argv = command(sys.argv[1:], env=os.environ, gpus=torch.cuda.device_count())
    os.execv(argv[0], argv)  # this process becomes the run (or torchrun): signals reach it directly


if __name__ == "__main__":
    main()
