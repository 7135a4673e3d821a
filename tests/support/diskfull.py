"""A disk that is full, without filling one: the file the code will write pointed at Linux's ``/dev/full``, whose every
write fails with ENOSPC (:func:`full`), or a file given a few bytes of room before its writes fail so (:func:`room`),
for a write a full disk stops part-way."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

FULL = Path("/dev/full")

# Tests that write into /dev/full: Linux's alone.
needs_full = pytest.mark.skipif(not (FULL.exists() and stat.S_ISCHR(FULL.stat().st_mode)),
                                reason="needs Linux's /dev/full")


def full(path: Path) -> Path:
    """``path`` made a link to /dev/full (what was there is removed): opening it works, every write fails with ENOSPC.
    A write that replaces the file (a new file renamed over it) replaces the link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(FULL)
    return path


def room(monkeypatch: pytest.MonkeyPatch, path: Path, left: int) -> None:
    """Writes into ``path`` (by ``os.write``, as nli.io.storage appends) take ``left`` bytes more, then fail with
    ENOSPC, as on a disk that fills in the middle of one: the write that fills it is written in part. Other files
    are written as ever."""
    write = os.write
    target = os.path.realpath(path)
    budget = [left]

    def limited(fd: int, data: bytes | memoryview) -> int:
        try:
            ours = os.path.realpath(f"/proc/self/fd/{fd}") == target
        except OSError:
            ours = False
        if not ours:
            return write(fd, data)
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        taken = write(fd, bytes(data[:budget[0]]))
        budget[0] -= taken
        return taken

    monkeypatch.setattr(os, "write", limited)
