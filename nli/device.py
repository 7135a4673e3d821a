"""The device a run uses and the precision it computes in, checked against the real hardware."""

from __future__ import annotations

import logging
import resource
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from nli import xla
from nli.config import Accelerator, HardwareConfig, Precision, PrecisionConfig
from nli.errors import ConfigError

log = logging.getLogger(__name__)

DTYPES = {Precision.fp32: torch.float32, Precision.fp16: torch.float16, Precision.bf16: torch.bfloat16}


def resolve_device(hw: HardwareConfig) -> torch.device:
    if hw.accelerator == Accelerator.cpu:
        return torch.device("cpu")
    if hw.accelerator == Accelerator.xla:
        return xla.device()
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if hw.accelerator == Accelerator.cuda:
        raise ConfigError(f"hw asks for a CUDA GPU ({hw.gpu}), but torch sees none here; "
                          "use hw=auto or hw=cpu on this machine")
    return torch.device("cpu")


def resolve_precision(cfg: PrecisionConfig, device: torch.device) -> torch.dtype:
    """``auto``: bf16 where the GPU has it, fp16 on older GPUs, bf16 on XLA (a TPU's own), fp32 on CPU
    (bf16 on a CPU with native bf16 is not yet shown to be faster at the same accuracy:
    ``precision=bf16`` asks for it)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
        torch.backends.cudnn.allow_tf32 = cfg.tf32
        bf16_ok = torch.cuda.is_bf16_supported()
        fp16_ok = torch.cuda.get_device_capability(device) >= (7, 0)
        name = torch.cuda.get_device_name(device)
    elif device.type == "xla":
        bf16_ok, fp16_ok, name = True, False, xla.describe()  # TPUs compute in bf16; XLA's autocast has no fp16
    else:
        bf16_ok, fp16_ok, name = True, False, f"the CPU ({cpu_kernels()})"  # CPU autocast has bf16, not fp16
    if cfg.dtype == Precision.auto:
        dtype = Precision.fp32 if device.type == "cpu" else (
            Precision.bf16 if bf16_ok else Precision.fp16 if fp16_ok else Precision.fp32)
    else:
        dtype = cfg.dtype
    if (dtype == Precision.bf16 and not bf16_ok) or (dtype == Precision.fp16 and not fp16_ok):
        raise ConfigError(f"precision={dtype.value} cannot run on {name}; use precision=auto "
                          f"(picks what {name} supports) or precision=fp32")
    log.info("device: %s (%s), precision %s", device, name, dtype.value)
    return DTYPES[dtype]


def cpu_kernels() -> str:
    """The vector instructions torch's CPU kernels use, and whether the CPU computes bf16 natively."""
    native = [name for name, has in (("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
                                     ("AMX", torch.cpu._is_amx_tile_supported())) if has]
    return f"{torch.backends.cpu.get_cpu_capability()} kernels, " + (
        f"native bf16: {', '.join(native)}" if native else "no native bf16")


@dataclass(frozen=True)
class Compute:
    """Where the run computes, and in which precision."""

    device: torch.device
    dtype: torch.dtype  # of the forward and backward pass (autocast); the weights stay float32

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def sync(self) -> None:
        """XLA: compile and run what was traced so far. CUDA and the CPU run each operation as it comes."""
        if self.device.type == "xla":
            xla.sync()


def resolve(hw: HardwareConfig, precision: PrecisionConfig) -> Compute:
    device = resolve_device(hw)
    return Compute(device=device, dtype=resolve_precision(precision, device))


def peak_memory_bytes(device: torch.device) -> int:
    """The most memory this process has held: tensors on the GPU or the TPU, or all of its resident
    memory on the CPU, XLA's CPU device included (Linux counts ru_maxrss in KiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if device.type == "xla" and (held := xla.peak_memory_bytes(device)) is not None:
        return held
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
