"""The TPU presets and the XLA path's parts that need no torch-xla: what each preset asks for, the
padding that keeps XLA's shapes few, and the error a run on a TPU preset gives where PyTorch/XLA is
not installed (the project's own environment). Training on XLA itself: tests/runs/test_xla.py (-m xla)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from nli.config.schema import Accelerator
from nli.data.loaders import BucketPadding, bucket_lengths
from nli.model.build import train_bpe_tokenizer
from tests.conftest import build_config
from tests.support.runs import FAST, process_env, run_app


@pytest.mark.parametrize("preset, tpu, devices, machine, accelerator, count, topology", [
    ("tpu-v5e-1", "v5e", 1, "ct5lp-hightpu-1t", None, None, "1x1"),
    ("tpu-v5e-8", "v5e", 8, "ct5lp-hightpu-8t", None, None, "2x4"),
    ("tpu-v3-8", "v3", 8, "cloud-tpu", "TPU_V3", 8, None),
    ("tpu-v2-8", "v2", 8, "cloud-tpu", "TPU_V2", 8, None),
])
def test_tpu_presets_ask_for_their_tpu(preset: str, tpu: str, devices: int, machine: str, accelerator: str | None,
                                       count: int | None, topology: str | None) -> None:
    hw = build_config([f"hw={preset}"]).hw
    assert (hw.accelerator, hw.tpu, hw.tpu_devices, hw.gpus_per_node, hw.bf16) == (Accelerator.xla, tpu, devices, 0,
                                                                                  True)
    assert hw.data_parallel_size == devices
    assert (hw.vertex.machine_type, hw.vertex.accelerator_type, hw.vertex.accelerator_count,
            hw.vertex.tpu_topology) == (machine, accelerator, count, topology)


def test_a_tpu_preset_needs_its_devices() -> None:
    with pytest.raises(Exception, match="hw.tpu_devices must be at least 1 when hw.accelerator=xla"):
        build_config(["hw=tpu-v5e-1", "hw.tpu_devices=0"])


def test_bucket_lengths_are_powers_of_two_up_to_the_longest() -> None:
    assert bucket_lengths(128) == [16, 32, 64, 128]
    assert bucket_lengths(100) == [16, 32, 64, 100]
    assert bucket_lengths(512) == [16, 32, 64, 128, 256, 512]
    assert bucket_lengths(12) == [12]


def test_bucket_padding_pads_each_batch_to_the_shortest_bucket_that_holds_it() -> None:
    tokenizer: PreTrainedTokenizerFast = train_bpe_tokenizer([f"word{i} other{i}" for i in range(200)],
                                                             vocab_size=300, max_seq_length=128)
    pad = BucketPadding(tokenizer, max_length=128)
    for longest, padded in ((5, 16), (16, 16), (17, 32), (40, 64), (100, 128)):
        features = [{"input_ids": [5] * n, "attention_mask": [1] * n, "labels": 0} for n in (3, longest)]
        batch = pad(features)
        assert batch["input_ids"].shape == (2, padded), longest
        assert batch["attention_mask"].sum(1).tolist() == [3, longest]  # padding is masked out
        assert batch["labels"].tolist() == [0, 0]


def test_without_pytorch_xla_a_tpu_preset_says_how_to_get_it(tmp_path: Path) -> None:
    """The project's own environment has no torch-xla (requirements/tpu.txt pins its own torch)."""
    proc = run_app([*FAST, "hw=tpu-v5e-1", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 1
    assert "hw.accelerator=xla needs PyTorch/XLA" in proc.stderr and "requirements/tpu.txt" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.process
def test_without_pytorch_xla_the_launcher_says_how_to_get_it(tmp_path: Path) -> None:
    """`python -m nli.xla_launch` (a TPU host's launcher) in an environment without torch-xla: the same one
    line as train.py's, not a traceback."""
    proc = subprocess.run([sys.executable, "-m", "nli.xla_launch", *FAST, "hw=tpu-v5e-8"], cwd=tmp_path,
                          env=process_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: hw.accelerator=xla needs PyTorch/XLA") and "Traceback" not in proc.stderr
