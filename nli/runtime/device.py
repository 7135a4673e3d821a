"""The device a run uses and the precision it computes in, checked against the real hardware."""

from __future__ import annotations

import logging
import os
import resource
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

import torch

from nli.config.schema import Accelerator, HardwareConfig, Precision, PrecisionConfig
from nli.errors import ConfigError
from nli.runtime import xla

log = logging.getLogger(__name__)

DTYPES = {Precision.fp32: torch.float32, Precision.fp16: torch.float16, Precision.bf16: torch.bfloat16}


def uses_cuda(hw: HardwareConfig) -> bool:
    """Whether the run computes on a CUDA GPU: ``hw`` asks for one, or leaves it to the machine, which has one."""
    return hw.accelerator in (Accelerator.auto, Accelerator.cuda) and torch.cuda.is_available()


def resolve_device(hw: HardwareConfig) -> torch.device:
    if hw.accelerator == Accelerator.xla:
        return xla.device()
    if uses_cuda(hw):
        return torch.device("cuda", torch.cuda.current_device())
    if hw.accelerator == Accelerator.cuda:
        raise ConfigError(f"hw asks for a CUDA GPU ({hw.gpu}), but torch sees none here; "
                          "use hw=auto or hw=cpu on this machine")
    return torch.device("cpu")


@dataclass(frozen=True)
class Native:
    """What a device computes at full speed: bf16 and fp16 (tensor cores), with its name for messages."""

    kind: str  # the device's type: cuda, cpu, xla
    name: str
    bf16: bool
    fp16: bool
    runs_fp16: bool = True  # whether fp16 runs at all (bf16 always does: emulated where it is not native)


def gpu_native(name: str, capability: Tuple[int, int]) -> Native:
    """A CUDA GPU by its compute capability: bf16 natively from 8.0 (Ampere: A100, A10, L4; Hopper: H100),
    fp16 tensor cores from 7.0 (Volta: V100; Turing: T4). torch.cuda.is_bf16_supported() answers True on
    7.x too (its default counts emulation), where bf16 runs without tensor cores, slower than fp32."""
    described = f"{name} (compute capability {capability[0]}.{capability[1]})"
    tensor_cores = capability >= (7, 0)
    return Native("cuda", described, bf16=capability >= (8, 0), fp16=tensor_cores, runs_fp16=tensor_cores)


def choose_precision(asked: Precision, native: Native, *, preset_bf16: bool = True,
                     preset_fp16: bool = True) -> Tuple[Precision, str]:
    """The precision a run computes in, and why (for the log). ``auto``: bf16 where the device has it natively
    and the hw preset allows it (``preset_bf16``: a GPU preset's ``hw.bf16``), else fp16 where it has tensor
    cores and the preset allows them, else fp32. An explicit precision is taken where it runs (slowly where
    emulated: the reason says so) and refused where it cannot."""
    if asked == Precision.auto:
        bf16, fp16 = native.bf16 and preset_bf16, native.fp16 and preset_fp16
        chosen = Precision.bf16 if bf16 else Precision.fp16 if fp16 else Precision.fp32
        why = {Precision.bf16: f"precision=auto: {native.name} computes bf16 natively",
               Precision.fp16: f"precision=auto: {native.name} has fp16 tensor cores"
                               + ("" if native.bf16 else " and no native bf16"),
               Precision.fp32: f"precision=auto: {native.name} has neither native bf16 nor fp16 tensor cores"}[chosen]
        if chosen != Precision.bf16 and native.bf16:
            why = f"precision=auto: the hw preset has hw.bf16=false ({native.name} has native bf16)"
        return chosen, why
    if asked == Precision.fp16 and not native.runs_fp16:
        raise ConfigError(f"precision={asked.value} cannot run on {native.name}; use precision=auto (picks what "
                          f"{native.name} supports) or precision=fp32")
    if asked == Precision.bf16 and not native.bf16:
        return asked, (f"precision=bf16 asked: {native.name} has no native bf16, so it is emulated, slower than "
                       f"fp32{' and several times slower than precision=fp16' if native.fp16 else ''}")
    return asked, f"precision={asked.value} asked"


def continued_precision(started: Precision, chosen: Precision, asked: Precision,
                        native: Native) -> Tuple[Precision, str]:
    """The precision a resumed run computes in: the one it ``started`` in, so that a run never changes precision
    part-way (``auto`` may pick another on another machine: preempted on an A100, requeued on a V100). A CPU
    without native bf16 goes on in emulated bf16 (slower, the same arithmetic); a GPU goes on only in a precision
    it computes natively, and a device that cannot compute the started one at all stops the run: a ConfigError
    that says why, its checkpoints kept."""
    if started == chosen or asked != Precision.auto:
        return chosen, ""
    if started == Precision.fp32 or (started == Precision.bf16 and native.bf16) or \
            (started == Precision.fp16 and native.fp16):
        return started, (f"the run started in {started.value} and goes on in it; precision=auto picks "
                         f"{chosen.value} here")
    if started == Precision.bf16 and native.kind == "cpu":  # emulated: slower, the same arithmetic
        return started, (f"the run started in bf16 and goes on in it, emulated (slower) on {native.name}; "
                         f"precision=auto picks {chosen.value} here")
    able = "at full speed" if started == Precision.bf16 or native.runs_fp16 else "at all"
    raise ConfigError(f"this run started in {started.value} (precision=auto on another device) and {native.name} "
                      f"cannot compute {started.value} {able}; a run does not change precision part-way. Continue it "
                      f"on a device that computes {started.value}, its checkpoints kept, or start afresh in another "
                      "output_dir")


def native_of(device: torch.device) -> Native:
    """What ``device`` computes natively. The CPU: bf16 where AVX512-BF16 or AMX serve it (:func:`cpu_native_bf16`;
    emulated bf16 is slower than fp32), never fp16 (CPU autocast here is bf16's); XLA: bf16, a TPU's own."""
    if device.type == "cuda":
        return gpu_native(torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
    if device.type == "xla":
        return Native("xla", xla.describe(), bf16=True, fp16=False, runs_fp16=False)  # XLA's autocast has no fp16
    bf16, why = cpu_native_bf16(os.environ)
    kernels = cpu_kernels()
    if not bf16 and "native bf16:" in kernels:  # the CPU's flags, taken away for this run (ONEDNN_MAX_CPU_ISA, ...)
        kernels = f"{kernels}, unused: {why}"
    return Native("cpu", f"the CPU ({kernels})", bf16=bf16, fp16=False, runs_fp16=False)


def resolve_precision(cfg: PrecisionConfig, device: torch.device, hw: Optional[HardwareConfig] = None,
                      started: Optional[Precision] = None) -> torch.dtype:
    """The dtype the run computes in (:func:`choose_precision`, bounded by a GPU preset's ``hw.bf16`` and
    ``hw.fp16``; on a resumed run, :func:`continued_precision` of the one it ``started`` in). The log line says
    which, and why."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
        torch.backends.cudnn.allow_tf32 = cfg.tf32
    native = native_of(device)
    preset = hw is not None and hw.accelerator == Accelerator.cuda and device.type == "cuda"
    chosen, why = choose_precision(cfg.dtype, native, preset_bf16=not preset or bool(hw and hw.bf16),
                                   preset_fp16=not preset or bool(hw and hw.fp16))
    if device.type == "cpu" and cfg.dtype == Precision.auto:
        why = f"precision=auto: {cpu_native_bf16(os.environ)[1]}"
    if started is not None:
        chosen, kept = continued_precision(started, chosen, cfg.dtype, native)
        why = kept or why
    emulated = chosen == Precision.bf16 and not native.bf16  # slower than fp32: said as a warning
    (log.warning if emulated else log.info)("device: %s (%s), precision %s (%s)", device, native.name, chosen.value,
                                            why)
    return DTYPES[chosen]


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
    of tests/support/reference.py pin both, for the same bits on any x86-64 CPU), and bf16 is then emulated."""
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

    @property
    def precision(self) -> Precision:
        return next(name for name, dtype in DTYPES.items() if dtype == self.dtype)

    def state_dict(self) -> Dict[str, Any]:
        """The precision the run computes in: kept in every checkpoint, so that a resumed run goes on in it
        (:func:`started_precision`, :func:`continued_precision`)."""
        return {"precision": self.precision.value}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Read before the run resolved its precision (:func:`started_precision`): nothing is left to restore."""


def started_precision(parts: Optional[Mapping[str, Any]]) -> Optional[Precision]:
    """The precision a checkpoint's run computed in (its ``compute`` part); None for a new run, or a checkpoint
    from before it was kept."""
    state = (parts or {}).get("compute")
    return Precision(state["precision"]) if state else None


def resolve(hw: HardwareConfig, precision: PrecisionConfig, *, started: Optional[Precision] = None) -> Compute:
    """The device and precision; ``started``: the precision a resumed run started in (its checkpoint's)."""
    device = resolve_device(hw)
    return Compute(device=device, dtype=resolve_precision(precision, device, hw, started))


class PeakMemory:
    """The most GPU memory the training steps held, as the Trainer's figure is: evaluations, checkpoints and an
    attempt that ran out of memory (nli.evaluate.oom) left out. torch's own peak is reset at the start, after each pause
    and after a failed attempt, and what the steps held before is kept (:meth:`keep`, at each step's start:
    a read of the allocator's counter, no wait for the GPU). Elsewhere it is :func:`peak_memory_bytes`, which
    cannot be reset (the CPU's is the process's whole resident peak)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.held = device, 0

    def reset(self) -> None:
        """Forget what was held since the last :meth:`keep` (a failed attempt's allocations)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def keep(self) -> None:
        """What the steps since the last reset held counts (on a GPU; elsewhere nothing is reset, and the peak is
        read once, at the end)."""
        if self.device.type == "cuda":
            self.held = max(self.held, peak_memory_bytes(self.device))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Around what is not a training step: an evaluation, a checkpoint."""
        self.keep()
        try:
            yield
        finally:
            self.reset()

    def training_peak(self) -> int:
        return max(self.held, peak_memory_bytes(self.device))


def peak_memory_bytes(device: torch.device) -> int:
    """The most memory this process has held: tensors on the GPU or the TPU, or all of its resident
    memory on the CPU, XLA's CPU device included (Linux counts ru_maxrss in KiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if device.type == "xla" and (held := xla.peak_memory_bytes(device)) is not None:
        return held
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
