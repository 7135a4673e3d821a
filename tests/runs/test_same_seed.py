"""The same seed trains the same weights, bit for bit, whatever the run does besides training: when and whether
it evaluates, what it logs and where, which extra sets it scores, whether it predicts the test split
(nli/train/loop.py: an evaluation leaves every random generator as it found it)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Sequence

import pytest
import torch

from tests.support.nli_layouts import write_sets
from tests.support.runs import FAST, GLUE_DATA, run_app

# 12 steps, one evaluation: at the end. RTE's files have a test split to predict; the synthetic task has none.
BASES = {"synthetic": [*FAST, "train.eval_every=12"],
         "rte": ["task=rte", f"data.dir={GLUE_DATA}", "model=tiny", "data.max_seq_length=64", "train.batch_size=16",
                 "train.max_steps=12", "train.eval_every=12", "train.progress_bar=false", "hw=cpu"]}
SETS = "<sets>"  # stands for a folder of extra evaluation sets the test writes


def trained(run_dir: Path) -> Dict[str, torch.Tensor]:
    """The weights training reached at its last step (its last checkpoint's: the export is the best step's)."""
    state = torch.load(run_dir / "checkpoints" / "step-000012" / "state.pt", weights_only=True)
    return state["parts"]["model"]


@pytest.mark.parametrize("base,besides", [
    ("synthetic", ["train.eval_every=3"]),  # evaluated at steps 3, 6 and 9 too: it drew from training's generator
    ("synthetic", ["train.eval_every=5", "train.log_every=1", "train.checkpoint_every=2"]),
    ("synthetic", ["logger=[csv,tensorboard,wandb]", "logger.wandb.mode=offline"]),
    ("synthetic", ["eval.extra=[hans]", f"eval.dir={SETS}"]),
    ("rte", ["train.predict=true"]),
], ids=["eval_every", "log-and-checkpoint-every", "loggers", "eval.extra", "predict"])
def test_what_a_run_does_besides_training_changes_no_weight(base: str, besides: List[str], tmp_path: Path,
                                                             shared_run: Callable[[str, Sequence[str]], Path]) -> None:
    alone = trained(shared_run(f"same-seed-{base}", BASES[base]))
    args = [arg.replace(SETS, str(write_sets(tmp_path / "sets"))) if SETS in arg else arg for arg in besides]
    proc = run_app([*BASES[base], *args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                   env={"WANDB_SILENT": "true"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ours = trained(tmp_path / "run")
    assert ours.keys() == alone.keys()
    differ = [key for key, tensor in alone.items() if not torch.equal(ours[key], tensor)]
    assert not differ, f"{len(differ)} of {len(alone)} tensors differ, {differ[0]} among them"
