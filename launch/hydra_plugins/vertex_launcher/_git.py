"""The git commit a sweep was launched from, and whether the tree had changes not committed: what
each job records beside its image, since the image holds no .git of its own (nli.runtime.provenance reads
it back in the job)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

from nli import contract
from nli.runtime import provenance


@dataclass(frozen=True)
class GitState:
    commit: str  # the full hash of HEAD
    dirty: bool  # tracked files changed since that commit (as results.json's provenance counts it)

    def env(self) -> Dict[str, str]:
        return {contract.JOB_COMMIT: self.commit, contract.JOB_DIRTY: "true" if self.dirty else "false"}

    def text(self) -> str:
        return f"{self.commit[:12]}{' with uncommitted changes' if self.dirty else ''}"


def git_state(folder: Path) -> Optional[GitState]:
    """The state of the repository ``folder`` is in; None outside one, without git, or with no commit."""
    found = provenance.code(folder)
    if found["commit"] is None:
        return None
    return GitState(commit=found["commit"], dirty=found["dirty"] is not False)  # unreadable: not known clean
