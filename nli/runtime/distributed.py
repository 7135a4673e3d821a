"""Data parallelism in plain torch.distributed: one process per device, one global batch.

The platform (nli.runtime.platform) says where this process stands: torchrun's standard variables, Vertex
AI's ``CLUSTER_SPEC`` or submitit's job environment, as ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``. With more than one process the run joins a process group:
NCCL on CUDA, gloo on the CPU. With one, nothing here talks to anything.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, ContextManager, Iterator, List, Mapping, Optional, Tuple

import torch
import torch.distributed as dist

from nli.errors import UserError

log = logging.getLogger(__name__)


def _told(error: Exception) -> str:
    """What the other ranks say of ``error``: a refusal's message as it is; a fault named by its type, its traceback
    being in the failing process's own output."""
    if isinstance(error, UserError):
        return str(error)
    return f"{type(error).__name__}: {error} (its traceback is in that process's output)"


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

    @contextmanager
    def together(self) -> Iterator[None]:
        """A block that some ranks may refuse or fail in (rank 0 alone claims the output folder and writes its
        record; each machine's first process copies a model from a bucket): at its end every rank learns whether
        one stopped, and each raises, the stopping rank its own error, the others one naming it. Otherwise the
        others went on to the next collective and waited there for the rank that had stopped: a traceback under
        gloo ("Connection closed by peer"), under NCCL for hw.collective_timeout_minutes where no launcher ends
        them (Slurm's tasks, a Vertex AI job's nodes)."""
        stopped: Optional[Exception] = None
        try:
            yield
        except Exception as error:  # a refusal (UserError), or a fault such as a storage client's unmapped OSError
            stopped = error
        said = self.gather(None if stopped is None else _told(stopped))
        if stopped is not None:
            raise stopped  # its own message, and for a fault its traceback
        first = next(((rank, message) for rank, message in enumerate(said) if message is not None), None)
        if first is not None:
            raise UserError(f"process {first[0]} of the run stopped it, and with it process {self.rank}: {first[1]}")

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

    def max(self, value: float) -> float:
        """The largest of every rank's ``value``, on every rank."""
        if not self.distributed:
            return value
        found = torch.tensor(value, dtype=torch.float64)  # gloo and NCCL both reduce a tensor on their own device
        if dist.get_backend() == "nccl":
            found = found.cuda()
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        return float(found.item())

    def max_later(self, value: float, device: torch.device) -> Callable[[], float]:
        """The largest of every rank's ``value``, to read later: the reduction is queued on ``device``'s stream and
        the function returned reads its result, waiting for that reduction alone (a copy to pinned memory and an
        event), not for the work queued after it, as :meth:`max` waits for everything queued so far."""
        if not self.distributed:
            return lambda: value
        if device.type != "cuda":  # gloo's reduction (XLA's too) is done when it returns
            got = self.max(value)
            return lambda: got
        found = torch.full((), value, dtype=torch.float64, device=device)
        dist.all_reduce(found, op=dist.ReduceOp.MAX)  # NCCL's: queued on the stream
        host = torch.empty((), dtype=torch.float64, pin_memory=True)
        host.copy_(found, non_blocking=True)
        done = torch.cuda.Event()
        done.record()

        def read() -> float:
            done.synchronize()
            return float(host)

        return read

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average the gradients over the ranks before the optimizer steps. Nothing to do here: DDP
        reduced them during ``backward`` (XLA's processes do it here: nli.runtime.xla.XlaWorld)."""

    def shard(self, size: int) -> Tuple[int, int]:
        """This rank's contiguous slice [lo, hi) of ``size`` items; the slices of ranks 0, 1, ...
        follow each other and cover them all, and differ in length by one at most."""
        return shard(size, rank=self.rank, world_size=self.world_size)


def shard(size: int, *, rank: int, world_size: int) -> Tuple[int, int]:
    return size * rank // world_size, size * (rank + 1) // world_size


def setup(process_env: Mapping[str, str], *, cuda: bool, timeout: timedelta = timedelta(minutes=60),
          rendezvous: timedelta = timedelta(minutes=15)) -> World:
    """Join the process group ``process_env`` describes (the platform's answer, nli.runtime.platform), if it
    describes more than one process: NCCL where the run computes on CUDA GPUs (``cuda``: what ``hw`` asks, not
    whether the machine has one: ``hw=cpu`` on a GPU machine is gloo's), else gloo. torch's env:// rendezvous reads
    the variables from os.environ.
    ``timeout`` (hw.collective_timeout_minutes): how long a rank waits in a collective for the others. NCCL's
    own default, 10 minutes, is less than rank 0 can take to write and upload a roberta-large checkpoint
    (4-5 GB with Adam's moments) while the others wait at the barrier after it. ``rendezvous``
    (hw.rendezvous_timeout_minutes): how long a rank waits for the others to join as the run starts."""
    if int(process_env.get("WORLD_SIZE", "1")) <= 1:
        return World()
    os.environ.update(process_env)
    world = World(rank=int(process_env["RANK"]), world_size=int(process_env["WORLD_SIZE"]),
                  local_rank=int(process_env.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(world.local_rank)  # before NCCL starts: one GPU per process
        store = _rendezvous(world, rendezvous)
        store.set_timeout(timeout)  # the group's own exchanges through it (NCCL's at its first collective)
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.PrefixStore("default_pg", store),
                                rank=world.rank, world_size=world.world_size, timeout=timeout)
        log.info("process %d of %d (local rank %d), %s backend", world.rank, world.world_size, world.local_rank,
                 dist.get_backend())
    return world


def _rendezvous(world: World, timeout: timedelta) -> dist.Store:
    """torch's env:// rendezvous, as ``init_process_group`` makes it (a TCPStore at MASTER_ADDR:MASTER_PORT held by
    rank 0, or torchrun's own), waiting ``timeout`` for every process to come rather than the collectives'
    timeout: a rank whose process 0 stopped as it started (an error on its node alone, a port in use) waited
    for it an hour, holding its GPU. Either failure is one line."""
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    try:
        store, _, _ = next(dist.rendezvous("env://", world.rank, world.world_size, timeout=timeout))
    except dist.DistError as error:
        if "EADDRINUSE" in str(error):
            raise UserError(f"MASTER_PORT={os.environ.get('MASTER_PORT')} is in use on this machine (another process "
                            "holds it), so process 0 cannot hold the run's rendezvous there: start the run with "
                            "another port (torchrun --master-port; under submitit, which draws it from the job's id, "
                            "a MASTER_PORT in the job's environment)") from None
        minutes = f"{timeout.total_seconds() / 60:g}"
        raise UserError(f"process {world.rank} of {world.world_size} waited {minutes} minutes "
                        f"(hw.rendezvous_timeout_minutes) at {where} for the run's other processes, and not all "
                        "came: one may have stopped as it started (its own output says why), or its machine "
                        "started later than that (raise hw.rendezvous_timeout_minutes)") from None
    return store


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """The model in DistributedDataParallel when there is more than one process; DDP averages
    the gradients over the ranks during ``backward``."""
    if not world.distributed or device.type == "xla":  # XLA's processes reduce in World.reduce_gradients
        return model
    ids = [device.index] if device.type == "cuda" else None
    # The gradients are views into DDP's all-reduce buckets rather than copies of them: one gradient's worth of
    # memory less (1.4 GB for roberta-large), and no copy out of the buckets after each all-reduce. DDP makes a
    # gradient such a view where the parameter has one as DDP is built, and after a synchronised backward pass; a
    # gradient that is None in the micro-batches that only accumulate (no_sync) comes back as a tensor of its own
    # beside the buckets, a whole gradient more at the step's peak. So each starts as zeros, and the steps zero
    # them in place rather than dropping them (keeps_gradients).
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)


def keeps_gradients(trained: torch.nn.Module) -> bool:
    """Whether the steps zero ``trained``'s gradients in place rather than set them to None: DDP's bucket views
    (:func:`wrap`), compiled or not."""
    return isinstance(getattr(trained, "_orig_mod", trained), torch.nn.parallel.DistributedDataParallel)


def no_sync(model: torch.nn.Module, *, sync: bool) -> ContextManager:
    """Skip DDP's gradient all-reduce on the micro-batches that only accumulate; the last one of
    the step reduces what all of them added up. A compiled model (train.compile) is the DDP wrapper compiled:
    its no_sync is the wrapper's, inside (an OptimizedModule is no DDP, and asking it would all-reduce every
    micro-batch)."""
    inner = getattr(model, "_orig_mod", model)
    if sync or not isinstance(inner, torch.nn.parallel.DistributedDataParallel):
        return nullcontext()
    return inner.no_sync()
