"""Where a run's numbers came from (nli/runtime/provenance.py): results.json's provenance, a sweep's commit per
job, and a checkout with uncommitted changes named dirty, found from the code's own folder."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

import pytest
import torch
import transformers

from nli.sweep import report
from nli.sweep import table as sweep
from tests.support.runs import FAST, ROOT, process_env, read_results, run_app
from tests.sweeps.test_sweep import rerun_sweep


def git(where: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_torchs_version_is_torchs_own_with_its_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyPI's CUDA wheels of torch are 2.13.0 to pip's metadata and 2.13.0+cu130 to torch: the record keeps the
    build (found running the suite on Python 3.13 with PyPI's torch, where the run's record said 2.13.0)."""
    from nli.runtime import provenance

    monkeypatch.setattr(torch, "__version__", "2.13.0+cu130")
    assert provenance.versions()["torch"] == "2.13.0+cu130"
    assert list(provenance.versions()) == ["python", *provenance.LIBRARIES]


def test_results_record_the_code_the_libraries_the_device_and_the_command(
        shared_run: Callable[[str, Sequence[str]], Path]) -> None:
    provenance = read_results(shared_run("fast", FAST))["provenance"]
    assert provenance["commit"] == git(ROOT, "rev-parse", "HEAD") and provenance["checkout"] == str(ROOT)
    assert provenance["dirty"] == bool(git(ROOT, "status", "--porcelain", "--untracked-files=no"))
    versions = provenance["versions"]
    assert versions["python"] == platform.python_version() and versions["torch"] == torch.__version__
    assert versions["transformers"] == transformers.__version__ and {"datasets", "nli-glue"} <= set(versions)
    assert provenance["device"] == {"type": "cpu", "processes": 1, "precision": "fp32",
                                    "name": provenance["device"]["name"]}
    threads = provenance["threads"]
    assert threads["cpu_count"] == os.cpu_count() and threads["usable"] == len(os.sched_getaffinity(0))
    assert 1 <= threads["torch"] <= threads["usable"]
    assert provenance["overrides"] == FAST  # as typed; hydra.run.dir is Hydra's, in argv
    assert provenance["argv"][0] == "train.py" and provenance["argv"][-1].startswith("hydra.run.dir=")
    assert provenance["command"] == "python train.py " + " ".join(FAST)


@pytest.mark.process
def test_a_checkout_with_a_modified_file_says_dirty_wherever_the_run_starts(tmp_path: Path) -> None:
    """A checkout of the project's code in a folder of its own, committed, then a tracked file changed:
    the code finds its checkout from where it is (the working directory is elsewhere), and says dirty."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "nli", checkout / "nli", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    git(checkout, "init", "-q")
    git(checkout, "add", ".")
    git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy")
    (tmp_path / "elsewhere").mkdir()
    script = ("import json, pathlib, nli.runtime.provenance as p; print(json.dumps(p.changed_code())); "
              "f = pathlib.Path(p.__file__).parents[1] / 'data' / 'synthetic.py'; "
              "f.write_text(f.read_text() + '# changed\\n'); print(json.dumps(p.changed_code())); "
              "f.write_text(f.read_text() + '# changed again\\n'); print(json.dumps(p.changed_code()))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path / "elsewhere", capture_output=True, text=True,
                          env=process_env({"PYTHONPATH": str(checkout)}), timeout=120)
    assert proc.returncode == 0, proc.stderr
    clean, dirty, dirtier = map(json.loads, proc.stdout.splitlines())
    head = git(checkout, "rev-parse", "HEAD")
    assert clean == {"commit": head, "dirty": False, "checkout": str(checkout), "changes": None}
    # The changes' digest tells two sets of uncommitted changes apart (nli.output.folder.record_code).
    assert dirty == {"commit": head, "dirty": True, "checkout": str(checkout), "changes": dirty["changes"]}
    assert re.fullmatch(r"[0-9a-f]{16}", dirty["changes"]) and dirtier["changes"] not in (None, dirty["changes"])


def test_a_sweeps_rows_and_report_carry_each_jobs_commit(shared_root: Path) -> None:
    sweep_dir = rerun_sweep(shared_root)
    head = git(ROOT, "rev-parse", "HEAD")
    done = [row for row in sweep.read_rows(sweep_dir) if row["state"] == sweep.COMPLETED]
    assert done and all(row["commit"] == head and isinstance(row["dirty"], bool) for row in done)
    assert all("provenance" not in row for row in done)  # one flat value per column; the rest in results.json
    assert read_results(sweep_dir / "0")["provenance"]["commit"] == head
    rows, _ = sweep.newest_sweep(sweep.read_rows(sweep_dir))
    table = report.job_table(rows, sweep.varying(rows), report.model_metrics(rows), folders=False)
    assert table.splitlines()[0].endswith("| commit | error |")
    assert f"| {head[:report.COMMIT_CHARS]}{' (dirty)' if rows[0]['dirty'] else ''} |" in table.splitlines()[2]


def test_a_job_from_an_image_names_the_commit_and_image_its_launcher_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Vertex AI job runs code from an image, which holds no .git: its results name the commit, the
    checkout's state and the image that the launcher put in its environment (nli.contract.JOB_*)."""
    from nli.runtime import provenance

    monkeypatch.setattr(provenance, "checkout", lambda: None)  # the code is not a checkout's, as in an image
    image = "us-central1-docker.pkg.dev/p/nli/train:src-0123@sha256:" + "ab" * 32
    done = run_app([*FAST, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                   env={"NLI_GIT_COMMIT": "c" * 40, "NLI_GIT_DIRTY": "true", "NLI_IMAGE_URI": image})
    assert done.returncode == 0, done.stderr
    code = read_results(tmp_path / "run")["provenance"]
    assert (code["commit"], code["dirty"], code["checkout"], code["image"]) == ("c" * 40, True, None, image)
