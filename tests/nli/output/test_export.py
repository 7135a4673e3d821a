"""nli.output.export alone: what it raises where the disk cannot take the model's files (the whole run's answer
to a full disk, one line and the same command continuing: tests/runs/test_export.py)."""

from __future__ import annotations

import errno
import stat
from pathlib import Path

import pytest
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from nli.evaluate.evaluation import Evaluation
from nli.output import export

# A model exported by an earlier version of the project, checked in (tests/data/README.md).
EXPORTED = Path(__file__).resolve().parents[2] / "data" / "legacy" / "run-finished" / "model"
FULL = Path("/dev/full")  # Linux's device whose every write fails with ENOSPC


@pytest.mark.skipif(not (FULL.exists() and stat.S_ISCHR(FULL.stat().st_mode)), reason="needs Linux's /dev/full")
def test_a_tokenizer_that_cannot_be_written_for_a_full_disk_raises_the_oserror_it_was(tmp_path: Path) -> None:
    """tokenizers writes tokenizer.json in Rust and reports a failed write as a plain Exception, "No space left
    on device (os error 28)": the export raises it as OSError(ENOSPC), which the run's entry point says as a full
    disk to make room on. The file here points at /dev/full, so the real library meets a real full disk."""
    (tmp_path / "tokenizer.json").symlink_to(FULL)
    model = AutoModelForSequenceClassification.from_pretrained(EXPORTED)
    with pytest.raises(OSError) as raised:
        export.fill(tmp_path, model, AutoTokenizer.from_pretrained(EXPORTED), Evaluation(1, {}, 0.5))
    assert raised.value.errno == errno.ENOSPC
    assert type(raised.value.__cause__) is Exception and "(os error 28)" in str(raised.value.__cause__)
    assert not (tmp_path / "export.json").exists()  # nothing vouches for a model that was not written
