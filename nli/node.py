"""The training image's entry point: ``python -m nli.node ARGS`` runs ``python -m nli ARGS`` once per
device of this machine, on every machine of the job.

One device (a CPU, one GPU) and one machine: the run itself, in this process's place. Several GPUs,
or several machines (Vertex AI's worker pools, described by ``CLUSTER_SPEC``): ``torchrun`` starts one
process per GPU and meets the other machines at the primary replica's address, so ``nli`` finds the
standard ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` variables it sets up its process group from.

A TPU host (the TPU image sets ``PJRT_DEVICE=TPU``): ``python -m nli.xla_launch``, which starts one process per
XLA device through PyTorch/XLA's own launcher (torchrun does not place TPU processes).
"""

from __future__ import annotations

import os
import sys
from typing import List, Mapping

import torch

from nli.contract import VERTEX_CLUSTER_SPEC
from nli.runtime.platform.vertex import node_of


def command(args: List[str], *, env: Mapping[str, str], gpus: int) -> List[str]:
    """The command line this machine runs: the run itself, or torchrun around it."""
    run = ["-m", "nli", *args]
    node = node_of(env[VERTEX_CLUSTER_SPEC]) if env.get(VERTEX_CLUSTER_SPEC) else None
    if env.get("PJRT_DEVICE") == "TPU":
        if node is not None and node.nodes > 1:  # the Vertex launcher refuses these before submitting
            raise SystemExit(f"this job has {node.nodes} TPU hosts; runs here use one (hw.nodes=1)")
        return [sys.executable, "-m", "nli.xla_launch", *args]
    if (node is None or node.nodes == 1) and gpus <= 1:
        return [sys.executable, *run]
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={max(gpus, 1)}"]
    if node is None or node.nodes == 1:
        return [*torchrun, "--standalone", *run]
    return [*torchrun, f"--nnodes={node.nodes}", f"--node-rank={node.node_rank}", f"--master-addr={node.master_addr}",
            f"--master-port={node.master_port}", *run]


def main() -> None:
    argv = command(sys.argv[1:], env=os.environ, gpus=torch.cuda.device_count())
    os.execv(argv[0], argv)  # this process becomes the run (or torchrun): signals reach it directly


if __name__ == "__main__":
    main()
