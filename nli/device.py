"""The device a run uses and the precision it computes in, checked against the real hardware."""

from __future__ import annotations

import logging
import os
import resource
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Mapping, Tuple

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
    """``auto``: bf16 where the GPU has it, fp16 on older GPUs, bf16 on XLA (a TPU's own); on the CPU,
    bf16 where it computes bf16 natively (AVX512-BF16 or AMX: MiniLM trained 1.3-1.6x faster at the
    same dev accuracy, benchmarks/RESULTS.md), else fp32 (emulated bf16 is slower than fp32). The log
    line says which, and why."""
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
    why = ""
    if cfg.dtype == Precision.auto and device.type == "cpu":
        native, reason = cpu_native_bf16(os.environ)
        dtype = Precision.bf16 if native else Precision.fp32
        why = f" (precision=auto: {reason})"
    elif cfg.dtype == Precision.auto:
        dtype = Precision.bf16 if bf16_ok else Precision.fp16 if fp16_ok else Precision.fp32
    else:
        dtype = cfg.dtype
    if (dtype == Precision.bf16 and not bf16_ok) or (dtype == Precision.fp16 and not fp16_ok):
        raise ConfigError(f"precision={dtype.value} cannot run on {name}; use precision=auto "
                          f"(picks what {name} supports) or precision=fp32")
    log.info("device: %s (%s), precision %s%s", device, name, dtype.value, why)
    return DTYPES[dtype]


def cpu_kernels() -> str:
    """The vector instructions torch's CPU kernels use, and whether the CPU computes bf16 natively."""
    native = [name for name, has in (("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
                                     ("AMX", torch.cpu._is_amx_tile_supported())) if has]
    return f"{torch.backends.cpu.get_cpu_capability()} kernels, " + (
        f"native bf16: {', '.join(native)}" if native else "no native bf16")


# oneDNN's instruction sets (ONEDNN_MAX_CPU_ISA, or DNNL_ its older name) that hold bf16 dot products.
ONEDNN_BF16_ISAS = frozenset({"ALL", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                              "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16"})


def cpu_native_bf16(env: Mapping[str, str]) -> Tuple[bool, str]:
    """Whether this CPU computes bf16 natively for a run started with ``env``, and why, for the log.
    The CPU's flags (AVX512-BF16, AMX) are not enough: ``ONEDNN_MAX_CPU_ISA`` below oneDNN's bf16
    kernels, or ``ATEN_CPU_CAPABILITY`` below torch's AVX-512 ones, take them away (the reference runs
    of tests/reference.py pin both, for the same bits on any x86-64 CPU), and bf16 is then emulated."""
    native = [name for name, has in (("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
                                     ("AMX", torch.cpu._is_amx_tile_supported())) if has]
    if not native:
        return False, "no native bf16 (AVX512-BF16 or AMX) on this CPU: emulated bf16 is slower than fp32"
    for key in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        isa = env.get(key, "").strip().upper()
        if isa and isa not in ONEDNN_BF16_ISAS:
            return False, f"{key}={env[key]} keeps oneDNN from its bf16 instructions"
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False, (f"torch's kernels are its {torch.backends.cpu.get_cpu_capability()} ones (ATEN_CPU_CAPABILITY),"
                       " without bf16 instructions")
    return True, "the CPU computes bf16 natively; precision=fp32 keeps fp32"


@dataclass(frozen=True)
class Compute:
    """Where the run computes, and in which precision."""

    device: torch.device
    dtype: torch.dtype  # of the forward and backward pass (autocast); the weights stay float32

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def inference(self) -> AbstractContextManager:
        """For a model that trains no more (the end of a run, an evaluation-only run): inference mode,
        which also skips autograd's version counters and view tracking. Not during training, where a
        tensor a model caches while it evaluates (a position table) would be refused by autograd
        afterwards; not on XLA, whose tensors are untested under it: no_grad there."""
        return torch.no_grad() if self.device.type == "xla" else torch.inference_mode()

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
