"""Data files in a bucket (``gs://``, or any URL fsspec reads), as local files the readers take.

Each object is fetched once into a cache folder named by its version: Cloud Storage's generation
(else the etag, else size and modification time), which changes whenever the object is written
again. So an object rewritten in the bucket is fetched and read afresh, and an unchanged one is
never fetched twice; the local copy's size and time then key the ``datasets`` cache as any local
file's do. Errors name the URL, never the cached copy.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Iterator

import datasets

from nli.errors import DataError


def is_remote(path: str) -> bool:
    return "://" in path


def local_copy(url: str) -> Path:
    """The object at ``url`` in the local cache, fetched if this version is not there yet."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise DataError(f"{url} does not exist") from None
    except OSError as err:  # no credentials, no network, no permission: gcsfs says which
        raise DataError(f"{url} cannot be read: {err}") from None
    if info.get("type") == "directory":
        raise DataError(f"{url} is a folder, not a file")
    target = _cache() / hashlib.sha256(url.encode()).hexdigest()[:16] / _version(info) / PurePosixPath(path).name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        try:
            fs.get_file(path, str(partial))
        except OSError as err:  # the connection or the permission failed part-way
            partial.unlink(missing_ok=True)
            raise DataError(f"{url} could not be fetched: {err}") from None
        os.replace(partial, target)  # whole or not at all: a run killed while fetching leaves no half file
    return target


def exists(url: str) -> bool:
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return bool(fs.exists(path))


@contextmanager
def named_as(url: str, local: Path) -> Iterator[None]:
    """DataErrors about the cached copy name the object it came from."""
    try:
        yield
    except DataError as err:
        message = str(err).replace(str(local.resolve()), url).replace(str(local), url)
        raise DataError(message) from None


def _version(info: Dict[str, Any]) -> str:
    for key in ("generation", "etag", "ETag"):
        if info.get(key):
            return "".join(char for char in str(info[key]) if char.isalnum())
    return f"{info.get('size')}-{info.get('mtime') or info.get('updated')}".replace(":", "")


def _cache() -> Path:
    return Path(datasets.config.HF_DATASETS_CACHE) / "nli-remote"
