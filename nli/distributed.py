"""Data parallelism in plain torch.distributed: one process per device, one global batch.

Under ``torchrun`` (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``) the run joins a process group: NCCL on CUDA, gloo on the CPU.
On Vertex AI, where a multi-replica job gets ``CLUSTER_SPEC`` instead, those variables are derived
from it (one process per replica). With neither, the run is one process and nothing here talks to
anything.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, ContextManager, Dict, List, Mapping, Tuple

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class World:
    """This process's place among the processes that share the global batch."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs, writes checkpoints and the run's outputs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        """Wait until every process gets here (after rank 0 writes what the others read)."""
        if self.distributed:
            dist.barrier()

    def gather(self, value: Any) -> List[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        if not self.distributed:
            return [value]
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks (in place, and returned)."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def shard(self, size: int) -> Tuple[int, int]:
        """This rank's contiguous slice [lo, hi) of ``size`` items; the slices of ranks 0, 1, ...
        follow each other and cover them all, and differ in length by one at most."""
        return shard(size, rank=self.rank, world_size=self.world_size)


def shard(size: int, *, rank: int, world_size: int) -> Tuple[int, int]:
    return size * rank // world_size, size * (rank + 1) // world_size


def from_cluster_spec(spec: str | Mapping[str, Any], *, processes_per_node: int = 1,
                      local_rank: int = 0) -> Dict[str, str]:
    """torch.distributed's variables from Vertex AI's ``CLUSTER_SPEC``: the primary replica
    (workerpool0's only one) is node 0 and the rendezvous host, workerpool1's replica ``i`` is
    node ``i + 1``; every node runs ``processes_per_node`` processes."""
    spec = json.loads(spec) if isinstance(spec, str) else spec
    cluster, task = spec["cluster"], spec["task"]
    host, port = cluster["workerpool0"][0].rsplit(":", 1)
    if task["type"] not in ("workerpool0", "workerpool1"):
        raise ValueError(f"CLUSTER_SPEC: task type {task['type']} is not a training worker pool")
    nodes = len(cluster["workerpool0"]) + len(cluster.get("workerpool1", []))
    node_rank = 0 if task["type"] == "workerpool0" else int(task["index"]) + 1
    return {"MASTER_ADDR": host, "MASTER_PORT": port, "NODE_RANK": str(node_rank),
            "WORLD_SIZE": str(nodes * processes_per_node), "RANK": str(node_rank * processes_per_node + local_rank),
            "LOCAL_RANK": str(local_rank)}


def setup(*, environ: Dict[str, str] | None = None) -> World:
    """Join the process group the environment describes, if any (once per process)."""
    env = os.environ if environ is None else environ
    if "RANK" not in env and "CLUSTER_SPEC" in env:
        derived = from_cluster_spec(env["CLUSTER_SPEC"])
        if int(derived["WORLD_SIZE"]) > 1:
            env.update(derived)  # torch's env:// rendezvous reads them from the environment
    if "RANK" not in env or int(env.get("WORLD_SIZE", "1")) <= 1:
        return World()
    world = World(rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]), local_rank=int(env.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(world.local_rank)  # before NCCL starts: one GPU per process
        dist.init_process_group("nccl" if cuda else "gloo")
        log.info("process %d of %d (local rank %d), %s backend", world.rank, world.world_size, world.local_rank,
                 dist.get_backend())
    return world


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """The model in DistributedDataParallel when there is more than one process; DDP averages
    the gradients over the ranks during ``backward``."""
    if not world.distributed:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module itself: its weights load at any world size."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def no_sync(model: torch.nn.Module, *, sync: bool) -> ContextManager:
    """Skip DDP's gradient all-reduce on the micro-batches that only accumulate; the last one of
    the step reduces what all of them added up."""
    if sync or not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return nullcontext()
    return model.no_sync()
