"""Data parallelism in plain torch.distributed: one process per device, one global batch.

Under ``torchrun`` (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``) the run joins a process group: NCCL on CUDA, gloo on the CPU.
Where a launcher describes the processes otherwise, those variables are derived from it: Vertex
AI's ``CLUSTER_SPEC`` (one process per replica) and submitit's job environment on Slurm (one
process per task: ``hydra.launcher.tasks_per_node``). With none, the run is one process and
nothing here talks to anything.
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


@dataclass(frozen=True)
class Node:
    """One machine of a Vertex AI job, as ``CLUSTER_SPEC`` places it."""

    nodes: int  # machines of the training pools: workerpool0's primary and workerpool1's replicas
    node_rank: int  # 0 for the primary, index + 1 for workerpool1's replica ``index``
    master_addr: str  # the primary's host: the rendezvous
    master_port: str


def node_of(spec: str | Mapping[str, Any]) -> Node:
    spec = json.loads(spec) if isinstance(spec, str) else spec
    cluster, task = spec["cluster"], spec["task"]
    if task["type"] not in ("workerpool0", "workerpool1"):
        raise ValueError(f"CLUSTER_SPEC: task type {task['type']} is not a training worker pool")
    host, port = cluster["workerpool0"][0].rsplit(":", 1)
    nodes = len(cluster["workerpool0"]) + len(cluster.get("workerpool1", []))
    return Node(nodes=nodes, node_rank=0 if task["type"] == "workerpool0" else int(task["index"]) + 1,
                master_addr=host, master_port=port)


def from_cluster_spec(spec: str | Mapping[str, Any], *, processes_per_node: int = 1,
                      local_rank: int = 0) -> Dict[str, str]:
    """torch.distributed's variables from Vertex AI's ``CLUSTER_SPEC``, every node running
    ``processes_per_node`` processes."""
    node = node_of(spec)
    return {"MASTER_ADDR": node.master_addr, "MASTER_PORT": node.master_port, "NODE_RANK": str(node.node_rank),
            "WORLD_SIZE": str(node.nodes * processes_per_node),
            "RANK": str(node.node_rank * processes_per_node + local_rank), "LOCAL_RANK": str(local_rank)}


def from_submitit() -> Dict[str, str]:
    """torch.distributed's variables from the job environment of a submitit task (Slurm or local):
    the first node's host, a port fixed by the job id, each task's global and local rank."""
    from submitit.helpers import TorchDistributedEnvironment  # only under submitit

    env = TorchDistributedEnvironment()  # reads it; its export() would also narrow CUDA_VISIBLE_DEVICES
    return {"MASTER_ADDR": env.master_addr, "MASTER_PORT": str(env.master_port), "RANK": str(env.rank),
            "WORLD_SIZE": str(env.world_size), "LOCAL_RANK": str(env.local_rank)}


def _derived(env: Mapping[str, str]) -> Dict[str, str]:
    """The variables a launcher that does not set them implies; none for a single process."""
    if "CLUSTER_SPEC" in env:
        derived = from_cluster_spec(env["CLUSTER_SPEC"])
    elif env.get("SUBMITIT_EXECUTOR"):
        derived = from_submitit()
    else:
        return {}
    return derived if int(derived["WORLD_SIZE"]) > 1 else {}


def setup(*, environ: Dict[str, str] | None = None) -> World:
    """Join the process group the environment describes, if any (once per process)."""
    env = os.environ if environ is None else environ
    if "RANK" not in env:
        env.update(_derived(env))  # torch's env:// rendezvous reads them from the environment
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
