"""The git commit a sweep was launched from, and whether the tree had changes not committed: what
each job records beside its image, since the image holds no .git of its own."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

# The variables each job gets (nli reads them into its results' provenance; a person, in the console).
COMMIT_VARIABLE = "NLI_GIT_COMMIT"
DIRTY_VARIABLE = "NLI_GIT_DIRTY"


@dataclass(frozen=True)
class GitState:
    commit: str  # the full hash of HEAD
    dirty: bool  # tracked files changed, or files git does not ignore added, since that commit

    def env(self) -> Dict[str, str]:
        return {COMMIT_VARIABLE: self.commit, DIRTY_VARIABLE: "true" if self.dirty else "false"}

    def text(self) -> str:
        return f"{self.commit[:12]}{' with uncommitted changes' if self.dirty else ''}"


def git_state(folder: Path) -> Optional[GitState]:
    """The state of the repository ``folder`` is in; None outside one, without git, or with no commit."""
    commit = _git(folder, "rev-parse", "--verify", "HEAD")
    if not commit:
        return None
    status = _git(folder, "status", "--porcelain", "--untracked-files=normal")
    return GitState(commit=commit, dirty=status != "")  # a status that cannot be read: not known clean


def _git(folder: Path, *args: str) -> Optional[str]:
    try:
        proc = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):  # no git here: nothing to record, nothing to refuse
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None
