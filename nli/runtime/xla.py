"""PyTorch/XLA, for runs on Cloud TPUs (``hw.accelerator=xla``): the device, the processes of a TPU
host and their collectives, and the count of compiled graphs. The launcher that starts one process per
XLA device is a process starter of its own (``python -m nli.xla_launch ARGS``, which ``nli.node`` runs
on a TPU host).

torch_xla is not a dependency of the project: it pins its own torch (requirements/tpu.txt, the TPU
image: ``docker build --target tpu``), so it is imported here alone, and only when a run asks for it.
``PJRT_DEVICE=CPU`` runs the same code on XLA's CPU device, as the tests do.

XLA traces the steps lazily and compiles each new graph it sees, so a run on it keeps its shapes to a
few (nli.data.loaders.BucketPadding) and cuts the trace once per optimizer step and per evaluation batch
(:func:`sync`); the number of graphs it compiled goes into the log and results.json.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any, Dict, List, Optional

import torch

from nli.errors import ConfigError
from nli.runtime.distributed import World

log = logging.getLogger(__name__)

INSTALL = ("hw.accelerator=xla needs PyTorch/XLA, which this environment lacks: pip install -r requirements/tpu.txt "
           "in an environment of its own (bash .ci/xla-env), or run the TPU image (docker build --target tpu)")


NO_DEVICE = ("on a TPU host, install the TPU runtime (pip install 'torch-xla[tpu]==2.9.0'; the TPU image has it); "
             "elsewhere, PJRT_DEVICE=CPU runs the XLA path on this machine's CPU (slowly: for trying it out)")


def runtime() -> ModuleType:
    """torch_xla, imported; PJRT_DEVICE defaults to the TPU, as on a TPU host (nli.cli asks for it before
    datasets imports torch_xla, which would pick the CPU where it finds no TPU)."""
    os.environ.setdefault("PJRT_DEVICE", "TPU")
    try:
        import torch_xla
    except ImportError as missing:
        raise ConfigError(f"{INSTALL} ({missing})") from None
    return torch_xla


_in_use = False  # set by device(): torch_xla may be imported (by transformers, say) in a run that does not use it


def in_use() -> bool:
    """Whether this process computes on an XLA device."""
    return _in_use


def device() -> torch.device:
    global _in_use
    found = runtime().device()
    _in_use = True
    return found


def describe() -> str:
    """The device kind PJRT runs on (TPU, CPU), for the log."""
    import torch_xla.runtime as xr

    return f"{xr.device_type()} through PyTorch/XLA {runtime().__version__}"


def sync() -> None:
    """Compile (once per new graph) and run what was traced since the last cut."""
    runtime().sync()


def compilations() -> Dict[str, float]:
    """The graphs XLA compiled in this process, and the seconds it took."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")  # (count, total nanoseconds, samples), or None before any
    count, nanoseconds = (data[0], data[1]) if data else (0, 0.0)
    return {"xla_compilations": int(count), "xla_compile_seconds": nanoseconds / 1e9}


def rng_state() -> Optional[int]:
    """XLA's own random generator (dropout on the device draws from it), if this process uses XLA."""
    if not in_use():
        return None
    import torch_xla.core.xla_model as xm

    return int(xm.get_rng_state())


def set_rng_state(state: Optional[int]) -> None:
    """XLA's generator as a checkpoint saved it; a run on another device (a TPU run resumed on a GPU)
    has none to set, and dropout there draws from torch's own."""
    if state is not None and in_use():
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(state)


def peak_memory_bytes(dev: torch.device) -> Optional[int]:
    """The most device memory this process held (a TPU's HBM); None where PJRT does not count it (CPU)."""
    import torch_xla.core.xla_model as xm

    try:
        return int(xm.get_memory_info(dev)["peak_bytes_used"])
    except (RuntimeError, KeyError):
        return None


class XlaWorld(World):
    """The processes of a TPU host, one per XLA device, talking through XLA's collectives. Gradients are
    summed by :meth:`reduce_gradients` before each optimizer step (the model is not wrapped in DDP)."""

    def barrier(self) -> None:
        import torch_xla.core.xla_model as xm

        xm.rendezvous("nli.barrier")

    def gather(self, value: Any) -> List[Any]:
        import torch_xla.core.xla_model as xm

        return list(xm.mesh_reduce("nli.gather", value, list))

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch_xla.core.xla_model as xm

        xm.all_reduce(xm.REDUCE_SUM, [tensor])  # in place
        return tensor

    def max(self, value: float) -> float:
        import torch_xla.core.xla_model as xm

        return float(xm.mesh_reduce("nli.max", value, max))

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        import torch_xla.core.xla_model as xm

        xm.reduce_gradients(optimizer)  # the mean over the processes, as DDP's


def setup() -> World:
    """This process's place among the XLA processes of the host (one per device)."""
    runtime()
    import torch_xla.runtime as xr

    try:
        xr.addressable_device_count()  # starts the runtime: libtpu, the chips
    except (OSError, RuntimeError) as failed:
        raise ConfigError(f"PyTorch/XLA found no {os.environ['PJRT_DEVICE']} device here ({failed}): {NO_DEVICE}") \
            from None
    if xr.addressable_device_count() > 1:
        # PyTorch/XLA runs a v2/v3 chip's two cores as threads of one process; a run is one Hydra app per
        # process (its config, signals and output folder are the process's), so it cannot be two threads.
        raise ConfigError(f"this process sees {xr.addressable_device_count()} XLA devices: PyTorch/XLA runs TPU "
                          "v2 and v3 cores as threads of one process, which a run cannot share. Use a TPU whose "
                          "chips are one device each (hw=tpu-v5e-1, hw=tpu-v5e-8)")
    if xr.world_size() <= 1:
        return World()
    world = XlaWorld(rank=xr.global_ordinal(), world_size=xr.world_size(), local_rank=xr.local_ordinal())
    log.info("process %d of %d (XLA device %d of this host)", world.rank, world.world_size, world.local_rank)
    return world
