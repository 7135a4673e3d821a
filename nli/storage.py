"""A run's output directory, on local disk or ``gs://bucket/prefix``, through fsspec.

Every write is all-or-nothing. A local file is written to a temporary name, flushed to disk and
renamed; a Cloud Storage object only appears once its upload completes. What spans several files
(a checkpoint) marks its completion with a file of its own, written last (nli/checkpoint.py).
"""

from __future__ import annotations

import os
import posixpath
import shutil
from pathlib import Path
from typing import List

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from nli.errors import StorageError


class Storage:
    """Files under one root directory, named by ``/``-separated paths relative to it."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs: fsspec.AbstractFileSystem
        self.fs, self.root = url_to_fs(self.url)
        self.local = isinstance(self.fs, LocalFileSystem)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def describe(self, *parts: str) -> str:
        """The full location, as a user would type it (gs://bucket/prefix/file)."""
        return posixpath.join(self.url, *parts)

    def check_writable(self) -> None:
        """Fail now, with the reason, rather than at the first checkpoint an hour in."""
        probe = ".write-test"
        try:
            self.write_bytes(probe, b"ok")
            self.fs.rm(self.path(probe))
        except OSError as err:
            raise StorageError(f"output_dir={self.url} is not writable: {_reason(err)}") from err

    def write_bytes(self, name: str, data: bytes) -> None:
        path = self.path(name)
        try:
            if self.local:
                _write_local_atomically(Path(path), data)
            else:
                self.fs.pipe_file(path, data)  # an object is visible only once fully uploaded
        except OSError as err:
            raise StorageError(f"could not write {self.describe(name)}: {_reason(err)}") from err

    def write_text(self, name: str, text: str) -> None:
        self.write_bytes(name, text.encode())

    def read_bytes(self, name: str) -> bytes:
        return self.fs.cat_file(self.path(name))

    def exists(self, name: str) -> bool:
        return self.fs.exists(self.path(name))

    def list(self, name: str) -> List[str]:
        """Names of the entries directly under ``name`` (none if it does not exist)."""
        if not self.fs.isdir(self.path(name)):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.path(name), detail=False))

    def remove(self, name: str) -> None:
        if self.fs.exists(self.path(name)):
            self.fs.rm(self.path(name), recursive=True)

    def upload_dir(self, local: Path, name: str) -> None:
        """Copy the files of a local directory to ``name``, replacing what was there. Locally the
        directory is swapped in whole; on Cloud Storage each file is replaced as it uploads."""
        try:
            if self.local:
                _replace_local_dir(local, Path(self.path(name)))
            else:
                for file in sorted(p for p in local.rglob("*") if p.is_file()):
                    self.fs.put_file(str(file), self.path(name, file.relative_to(local).as_posix()))
        except OSError as err:
            raise StorageError(f"could not write {self.describe(name)}: {_reason(err)}") from err


def _reason(err: OSError) -> str:
    if isinstance(err, FileNotFoundError) and not isinstance(err, StorageError):
        return f"{err} (does the bucket or parent directory exist?)"
    return str(err)


def _write_local_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tmp")
    try:
        with open(staging, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it visible
        os.replace(staging, path)
    except OSError:
        staging.unlink(missing_ok=True)  # a full disk must not also leave half a file behind
        raise


def _replace_local_dir(source: Path, target: Path) -> None:
    """Copy ``source`` beside ``target``, then swap it in: a crash keeps the previous one."""
    staging, old = target.with_name(target.name + ".tmp"), target.with_name(target.name + ".old")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)
