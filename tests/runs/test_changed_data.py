"""A run resumed on training data that changed since its checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.runs import GLUE_DATA, run_app, run_process

RUN = ["task=rte", "model=tiny", "data.max_seq_length=32", "data.max_eval_samples=16", "train.batch_size=16",
       "train.eval_every=2", "train.progress_bar=false", "hw=cpu"]


@pytest.mark.parametrize("lines_now", [21, 121], ids=["shrunk-below-its-place", "grown"])
def test_a_training_set_of_another_size_than_the_checkpoints_is_refused(tmp_path: Path, lines_now: int) -> None:
    """The checkpoint was 32 examples into an epoch of 100. A training file of 20 now: the epoch held no batch, and
    the resumed run waited on one for ever, spinning a core, deaf to SIGTERM's stop. Of 120: it went on without a
    word, its place, order and epochs counted in examples that are no longer the ones it trained on. Each is refused,
    naming both counts, with the checkpoints as they were."""
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    lines = (GLUE_DATA / "RTE" / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    train.write_text("".join(lines[:101]), encoding="utf-8")
    dev.write_text((GLUE_DATA / "RTE" / "dev.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    run_dir = tmp_path / "run"
    args = [*RUN, f"+data.files.train={train}", f"+data.files.validation={dev}", f"hydra.run.dir={run_dir}"]
    first = run_app([*args, "train.max_steps=2"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    checkpoints = sorted(path.name for path in (run_dir / "checkpoints").iterdir())
    train.write_text("".join(lines[:lines_now]), encoding="utf-8")
    resumed = run_process([*args, "train.max_steps=4", "train.accept_changes=[train.max_steps]"], cwd=tmp_path,
                          timeout=120)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert resumed.stderr.startswith(f"error: this run trained on 100 training examples an epoch, and its training "
                                     f"set now has {lines_now - 1}: the training data changed since its checkpoint "
                                     "of step 2"), resumed.stderr
    assert sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == checkpoints
