"""Where a run's numbers came from: the code, the libraries, the machine and the command, as
results.json records them under ``provenance`` (and a sweep's table, the commit of each job).

The code is the git commit of the checkout the ``nli`` package was imported from (found from the
package's own location, not the working directory: a run started from anywhere names the code it
ran), and whether that checkout had uncommitted changes to tracked files (untracked files are left
out: a checkout holds outputs and notes of its user's that change nothing), with a digest of them.
Code installed from a package, not a checkout, is named by the project's version instead; a Vertex AI
job, whose image holds no .git, by the commit and image its launcher recorded (nli.contract.JOB_COMMIT,
JOB_IMAGE).
Nothing here fails a run: what cannot be found (no git, no checkout) is recorded as null.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

from nli import contract

# torch loads where a run describes its device, not at import: the Vertex launcher reads the code's commit
# from here in the process that launches a sweep, which never trains (2 s less for each sweep launched).
if TYPE_CHECKING:
    from nli.runtime.device import Compute
    from nli.runtime.distributed import World

PROJECT = "nli-glue"  # the distribution's name (pyproject.toml)
LIBRARIES = ("torch", "transformers", "datasets", "huggingface-hub", "peft", "hydra-core", PROJECT)
_GIT_SECONDS = 10  # a git that hangs (a network file system) must not hold the run
CHANGES_DIGITS = 16  # of the uncommitted changes' SHA-256: enough to tell two sets of changes apart


def checkout() -> Optional[Path]:
    """The git checkout the ``nli`` package was imported from; None where it was installed from a package."""
    root = Path(__file__).resolve().parents[2]  # nli/runtime/provenance.py -> the checkout
    top = _git(root, "rev-parse", "--show-toplevel")
    return root if top is not None and Path(top).resolve() == root else None


def code(root: Optional[Path] = None) -> Dict[str, Any]:
    """The commit and whether tracked files differ from it (``dirty``), with the checkout's folder; all
    None where the code is not a checkout's (then the project's version in :func:`versions` names it)."""
    root = root if root is not None else checkout()
    if root is None:
        return launched()
    commit = _git(root, "rev-parse", "HEAD")
    changes = _git(root, "status", "--porcelain", "--untracked-files=no") if commit is not None else None
    return {"commit": commit, "dirty": bool(changes) if changes is not None else None,
            "checkout": str(root) if commit is not None else None}


def changes(root: Optional[Path]) -> Optional[str]:
    """A digest of the uncommitted changes to the checkout's tracked files (``git diff HEAD``), where it has
    some: two attempts of a run from one dirty checkout ran the same code only where it is the same; None
    for a clean checkout, or code that is not a checkout's."""
    diff = _git(root, "diff", "HEAD", "--no-ext-diff", "--no-color") if root is not None else None
    return hashlib.sha256(diff.encode()).hexdigest()[:CHANGES_DIGITS] if diff else None


def changed_code() -> Dict[str, Any]:
    """:func:`code`, with the digest of its uncommitted changes (:func:`changes`) where it has some."""
    found = code()
    return {**found, "changes": changes(Path(found["checkout"]) if found.get("dirty") and found.get("checkout")
                                        else None)}


def code_of(record: Mapping[str, Any]) -> Dict[str, Any]:
    """What of a run's provenance (:func:`collect`) names the code that computed its steps: the commit, the
    uncommitted changes (whether, and which), and the libraries' versions. Two attempts of one run whose
    ``code_of`` differ computed with other code."""
    return {**{key: record.get(key) for key in ("commit", "dirty", "changes")}, "versions": record.get("versions")}


def code_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> List[str]:
    """How the code of :func:`code_of` ``new`` differs from ``old``, a phrase for each part that does."""
    found = [f"commit {old.get('commit')} -> {new.get('commit')}"] if old.get("commit") != new.get("commit") else []
    before, after = (each.get("changes") if each.get("dirty") else None for each in (old, new))
    if (old.get("dirty"), before) != (new.get("dirty"), after):
        found.append(f"uncommitted changes {before or 'none'} -> {after or 'none'}")
    versions = (old.get("versions") or {}, new.get("versions") or {})
    found += [f"{name} {versions[0].get(name)} -> {versions[1].get(name)}" for name in
              dict.fromkeys([*versions[0], *versions[1]]) if versions[0].get(name) != versions[1].get(name)]
    return found


def launched() -> Dict[str, Any]:
    """The code of a job from an image (which holds no .git), as the Vertex launcher told it: the commit
    and state of the checkout it was launched from, and the image; all None where nothing told it."""
    dirty = os.environ.get(contract.JOB_DIRTY)
    return {"commit": os.environ.get(contract.JOB_COMMIT) or None,
            "dirty": None if dirty not in ("true", "false") else dirty == "true", "checkout": None,
            "image": os.environ.get(contract.JOB_IMAGE) or None}


def _git(where: Path, *args: str) -> Optional[str]:
    """git's output in ``where``, stripped; None where git is missing or fails there."""
    try:
        done = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=_GIT_SECONDS,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})  # status takes no index lock
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> Dict[str, Optional[str]]:
    """Python's and each library's version, the project's too, as installed (None: not installed; the
    project's, where its code runs from a checkout without installing it). torch's as torch says it, its
    build included: PyPI's CUDA wheels are 2.13.0 to pip and 2.13.0+cu130 to torch."""
    import torch  # the run that asks has loaded it

    return {"python": platform.python_version(), **{name: version(name) for name in LIBRARIES},
            "torch": str(torch.__version__)}


def device(compute: Compute, world: World) -> Dict[str, Any]:
    """The device the run computed on: its kind and name, the processes (one per device under data
    parallelism), and the CUDA or XLA version; the precision it computed in, as resolved (auto's pick)."""
    import torch

    from nli.runtime import xla

    kind = compute.device.type
    precision = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[compute.dtype]
    found: Dict[str, Any] = {"type": kind, "processes": world.world_size, "precision": precision}
    if kind == "cuda":
        found.update(name=torch.cuda.get_device_name(compute.device), count=torch.cuda.device_count(),
                     cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    elif kind == "xla":
        found.update(name=xla.describe(), xla=version("torch-xla") or version("torch_xla"))
    else:
        found.update(name=cpu_name())
    return found


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model as Linux names it; elsewhere the machine's architecture."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        lines = []
    named = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return named or platform.processor() or platform.machine()


def threads() -> Dict[str, Any]:
    """The CPU threads torch computes with, and the CPUs the host has and this process may use."""
    import torch

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"torch": torch.get_num_threads(), "cpu_count": os.cpu_count(), "usable": usable}


def command(overrides: Sequence[str]) -> str:
    """The command that runs this config again: ``python train.py`` with the overrides as typed."""
    return " ".join(["python train.py", *(shlex.quote(each) for each in overrides)])


def collect(compute: Compute, world: World, overrides: List[str]) -> Dict[str, Any]:
    """Everything above, as results.json's ``provenance``; ``overrides``: the run's, as typed. ``command``
    is for a run started by ``python train.py`` (or ``python -m nli``); one started from Python (a
    notebook) has none: its config is in config.yaml."""
    started = Path(sys.argv[0]).name in ("train.py", "__main__.py") if sys.argv else False
    return {**changed_code(), "versions": versions(), "device": device(compute, world), "threads": threads(),
            "overrides": list(overrides), "argv": list(sys.argv), "command": command(overrides) if started else None}
