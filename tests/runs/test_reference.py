"""What a run computes has not changed: the README's quickstart ends with the results and exported
weights recorded before the run became a library call (tests/support/reference.py), bit for bit, at the
accuracy the README promises. (The two-process torchrun reference is checked in test_distributed.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.reference import digest, recorded, run


@pytest.mark.process  # the portable kernels are chosen as torch loads: in a process of its own
def test_the_quickstart_computes_what_it_computed_before(tmp_path: Path) -> None:
    run_dir = tmp_path / "quickstart"
    proc = run("quickstart", run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ours, reference = digest(run_dir), recorded("quickstart")
    assert ours["results"]["accuracy"] >= 0.85  # the README's "near 0.9"
    assert {key: ours["results"].get(key) for key in reference["results"]} == reference["results"]
    assert ours["weights"].keys() == reference["weights"].keys()
    changed = sorted(key for key, sha in reference["weights"].items() if ours["weights"][key] != sha)
    assert not changed, f"{len(changed)} exported tensors differ from the reference, e.g. {changed[:3]}"
