"""Precision by what the device computes natively: ``auto`` as a pure function of a GPU's compute capability
and the hw preset's flags, an explicit precision warned or refused where it is emulated or cannot run, and a
resumed run that keeps the precision it started in."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Dict

import pytest
import torch

from nli.config.schema import (
    Accelerator,
    HardwareConfig,
    Precision,
)
from nli.errors import ConfigError
from nli.runtime.device import Native, choose_precision, continued_precision, gpu_native
from tests.support.runs import FAST, run_app

GPUS = {"V100": (7, 0), "T4": (7, 5), "A10": (8, 6), "L4": (8, 9), "A100": (8, 0), "H100": (9, 0), "P100": (6, 0)}
CPU_BF16 = Native("cpu", "the CPU (AVX512 kernels, native bf16: AMX)", bf16=True, fp16=False, runs_fp16=False)
CPU_FP32 = Native("cpu", "the CPU (AVX512 kernels, no native bf16)", bf16=False, fp16=False, runs_fp16=False)


@pytest.mark.parametrize("gpu,expected", [("V100", Precision.fp16), ("T4", Precision.fp16), ("A10", Precision.bf16),
                                          ("L4", Precision.bf16), ("A100", Precision.bf16), ("H100", Precision.bf16),
                                          ("P100", Precision.fp32)])
def test_auto_is_bf16_from_ampere_fp16_on_volta_and_turing_fp32_below(gpu: str, expected: Precision) -> None:
    chosen, why = choose_precision(Precision.auto, gpu_native(f"NVIDIA {gpu}", GPUS[gpu]))
    assert chosen == expected
    assert f"NVIDIA {gpu} (compute capability {GPUS[gpu][0]}.{GPUS[gpu][1]})" in why


@pytest.mark.parametrize("preset,gpu,expected", [
    ("v100", "A100", Precision.fp16),  # the preset says no bf16: auto keeps to it, even on a GPU that has it
    ("a100", "A100", Precision.bf16), ("t4", "T4", Precision.fp16), ("h100", "H100", Precision.bf16),
    ("a100", "V100", Precision.fp16),  # a preset's bf16 is no use where the GPU has none
])
def test_auto_respects_the_presets_flags(preset: str, gpu: str, expected: Precision) -> None:
    from omegaconf import OmegaConf

    from tests.support.runs import CONF

    flags = OmegaConf.load(CONF / "hw" / f"{preset}.yaml")
    chosen, why = choose_precision(Precision.auto, gpu_native(gpu, GPUS[gpu]), preset_bf16=flags.bf16,
                                   preset_fp16=flags.fp16)
    assert chosen == expected, why


def test_explicit_bf16_on_a_gpu_without_native_bf16_runs_and_says_it_is_emulated() -> None:
    chosen, why = choose_precision(Precision.bf16, gpu_native("Tesla V100-SXM2-16GB", GPUS["V100"]))
    assert chosen == Precision.bf16
    assert "no native bf16, so it is emulated, slower than fp32 and several times slower than precision=fp16" in why


def test_explicit_fp16_without_tensor_cores_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"precision=fp16 cannot run on Tesla P100 \(compute capability 6.0\)"):
        choose_precision(Precision.fp16, gpu_native("Tesla P100", GPUS["P100"]))


def test_the_device_line_warns_when_bf16_is_emulated(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The log's device line names the GPU, its capability, the precision and why, as a warning when slow."""
    from nli.config.schema import PrecisionConfig
    from nli.runtime.device import resolve_precision

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: GPUS["T4"])
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", torch.backends.cuda.matmul.allow_tf32)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)
    hw = HardwareConfig(accelerator=Accelerator.auto)
    with caplog.at_level(logging.INFO, logger="nli.runtime.device"):
        assert resolve_precision(PrecisionConfig(dtype=Precision.auto), torch.device("cuda", 0), hw) == torch.float16
        assert resolve_precision(PrecisionConfig(dtype=Precision.bf16), torch.device("cuda", 0), hw) == torch.bfloat16
    auto, asked = caplog.records
    assert auto.levelno == logging.INFO and "Tesla T4 (compute capability 7.5)" in auto.getMessage()
    assert ("precision fp16 (precision=auto: Tesla T4 (compute capability 7.5) has fp16 tensor cores"
            in auto.getMessage())
    assert asked.levelno == logging.WARNING and "precision bf16 (precision=bf16 asked:" in asked.getMessage()


# ----------------------------------------------------------------------------------- a resumed run


def test_preempted_on_an_a100_in_bf16_and_requeued_on_a_v100_stops_with_why() -> None:
    v100 = gpu_native("Tesla V100-SXM2-16GB", GPUS["V100"])
    chosen, _ = choose_precision(Precision.auto, v100)
    with pytest.raises(ConfigError, match=r"this run started in bf16 \(precision=auto on another device\) and Tesla "
                                          r"V100-SXM2-16GB \(compute capability 7.0\) cannot compute bf16 at full "
                                          r"speed; a run does not change precision part-way"):
        continued_precision(Precision.bf16, chosen, Precision.auto, v100)


@pytest.mark.parametrize("started,device,expected", [
    (Precision.fp16, "A100", Precision.fp16),  # fp16 tensor cores there too: it goes on in fp16
    (Precision.bf16, "H100", Precision.bf16),  # what auto picks there anyway: nothing to say
    (Precision.fp32, "A100", Precision.fp32),  # begun where auto gave fp32: fp32 runs anywhere
])
def test_a_resumed_run_on_another_gpu_goes_on_in_its_precision(started: Precision, device: str,
                                                              expected: Precision) -> None:
    native = gpu_native(device, GPUS[device])
    chosen, _ = choose_precision(Precision.auto, native)
    kept, why = continued_precision(started, chosen, Precision.auto, native)
    assert chosen == Precision.bf16 and kept == expected
    assert why == ("" if started == chosen else
                   f"the run started in {started.value} and goes on in it; precision=auto picks bf16 here")


def test_fp16_continued_on_the_cpu_is_refused() -> None:
    with pytest.raises(ConfigError, match="started in fp16 .* cannot compute fp16 at all"):
        continued_precision(Precision.fp16, Precision.fp32, Precision.auto, CPU_FP32)


def test_bf16_begun_on_a_cpu_with_amx_goes_on_in_bf16_on_one_without(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """The quickstart's case: begun in bf16 (precision=auto on a CPU with AMX), continued on a CPU without native
    bf16, where auto picks fp32. It goes on in bf16, emulated, and results.json says bf16."""
    import nli.runtime.device

    run_dir = tmp_path / "run"
    args = [*FAST, "hw=cpu", "precision=auto", f"hydra.run.dir={run_dir}"]
    monkeypatch.setattr(nli.runtime.device, "cpu_native_bf16", lambda env: (True, "the CPU computes bf16 natively"))
    first = run_app([*args, "train.max_steps=6"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "precision bf16 (precision=auto: the CPU computes bf16 natively" in first.stdout
    monkeypatch.setattr(nli.runtime.device, "cpu_native_bf16", lambda env: (False, "no native bf16 on this CPU"))
    second = run_app([*args, "train.max_steps=12", "train.accept_changes=[train.max_steps]"], cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "precision bf16 (the run started in bf16 and goes on in it, emulated (slower) on the CPU" in second.stdout
    results = json.loads((run_dir / "results.json").read_text())
    assert results["train_steps"] == 12 and results["provenance"]["device"]["precision"] == "bf16"


@pytest.mark.parametrize("asked,computed", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_on_the_cpu_precision_is_what_was_asked(asked: str, computed: torch.dtype) -> None:
    from nli.config.schema import Precision, PrecisionConfig
    from nli.runtime.device import resolve_precision

    assert resolve_precision(PrecisionConfig(dtype=Precision(asked)), torch.device("cpu")) == computed


@pytest.mark.parametrize("bf16, amx, capability, env, computed, why", [
    (True, False, "AVX512", {}, torch.bfloat16, "the CPU computes bf16 natively; precision=fp32 keeps fp32"),
    (False, True, "AVX512", {}, torch.bfloat16, "the CPU computes bf16 natively"),  # AMX alone
    (False, False, "AVX2", {}, torch.float32, "no native bf16 (AVX512-BF16 or AMX) on this CPU"),
    # The reference runs' pins (tests/support/reference.py) take the bf16 instructions away: they stay fp32.
    (True, False, "AVX512", {"ONEDNN_MAX_CPU_ISA": "SSE41"}, torch.float32,
     "ONEDNN_MAX_CPU_ISA=SSE41 keeps oneDNN from its bf16 instructions"),
    (True, False, "AVX512", {"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"}, torch.bfloat16, "natively"),
    (True, False, "DEFAULT", {}, torch.float32, "torch's kernels are its DEFAULT ones (ATEN_CPU_CAPABILITY)"),
])
def test_on_the_cpu_auto_is_bf16_where_the_cpu_computes_it_natively(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, bf16: bool, amx: bool, capability: str,
        env: Dict[str, str], computed: torch.dtype, why: str) -> None:
    from nli.config.schema import Precision, PrecisionConfig
    from nli.runtime.device import resolve_precision

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # the suite's pin (tests/conftest.py): the case's own
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.INFO, logger="nli.runtime.device"):
        assert resolve_precision(PrecisionConfig(dtype=Precision.auto), torch.device("cpu")) == computed
    name = "bf16" if computed == torch.bfloat16 else "fp32"
    assert f"precision {name} (precision=auto: " in caplog.text and why in caplog.text


def test_bf16_asked_where_the_environment_takes_the_cpus_bf16_away_says_so_without_contradiction(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The warning read "the CPU (AVX512 kernels, native bf16: AVX512-BF16) has no native bf16": the flags, and
    not what took them away for the run."""
    from nli.config.schema import Precision, PrecisionConfig
    from nli.runtime.device import resolve_precision

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    with caplog.at_level(logging.INFO, logger="nli.runtime.device"):
        assert resolve_precision(PrecisionConfig(dtype=Precision.bf16), torch.device("cpu")) == torch.bfloat16
    assert "native bf16: AVX512-BF16, unused: ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN from its bf16 instructions) " \
           "has no native bf16, so it is emulated" in caplog.text, caplog.text


def test_on_the_cpu_fp16_is_refused_with_what_runs() -> None:
    from nli.config.schema import Precision, PrecisionConfig
    from nli.runtime.device import resolve_precision

    with pytest.raises(ConfigError, match=r"precision=fp16 cannot run on the CPU .*use precision=auto"):
        resolve_precision(PrecisionConfig(dtype=Precision.fp16), torch.device("cpu"))


@pytest.mark.parametrize("hw, computes_on_cuda", [
    ({"accelerator": Accelerator.auto}, True), ({"accelerator": Accelerator.cuda, "gpus_per_node": 1}, True),
    ({"accelerator": Accelerator.cpu}, False), ({"accelerator": Accelerator.xla, "tpu_devices": 8}, False)])
def test_on_a_gpu_machine_hw_says_whether_the_run_is_cudas(monkeypatch: pytest.MonkeyPatch, hw: Dict[str, object],
                                                          computes_on_cuda: bool) -> None:
    """``torchrun ... hw=cpu`` on a machine with GPUs: gloo and the CPU, where the process group's backend was picked
    from the machine alone (NCCL, whose collectives then met a model and tensors on the CPU)."""
    from nli.runtime.device import uses_cuda

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert uses_cuda(HardwareConfig(**hw)) is computes_on_cuda  # type: ignore[arg-type]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert uses_cuda(HardwareConfig(**hw)) is False  # type: ignore[arg-type]
