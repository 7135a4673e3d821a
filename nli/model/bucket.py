"""A model folder in a bucket (``gs://bucket/.../run/model``), as the local folder transformers reads.

Transformers reads a local folder or the Hub, never a bucket: a model given by its ``gs://`` URL (to
fine-tune from a run's export, as the recipes' ``*-from-mnli`` step does, or to evaluate a run folder
in a bucket) is copied into a local cache once, then read as any local folder.

The cache is ``$HF_HOME/nli-bucket-models`` (``~/.cache/huggingface/nli-bucket-models`` by default),
one folder per URL and, within it, one per version of the folder: a digest of every object's name,
size and generation (Cloud Storage gives an object a new generation whenever it is written). Listing
the folder is one request; a folder unchanged since its last copy is not copied again, and one that
was rewritten (a run that exported a better model since) is copied afresh. A copy appears whole or not
at all (copied beside its place, then renamed), and is checked against the SHA-256 of each file that
the run's ``export.json`` records before it is used, as a local run folder's export is. Older versions
are left in the cache; delete the folder to reclaim the space.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List

from nli import contract
from nli.config.schema import ModelConfig
from nli.errors import ConfigError, StorageError
from nli.io.storage import TIMEOUT, Storage
from nli.model import integrity

log = logging.getLogger(__name__)

CACHE_NAME = "nli-bucket-models"


@dataclass(frozen=True)
class Remote:
    """One object of the folder: its path below the folder, size and version."""

    name: str
    size: int
    version: str


def cache_dir() -> Path:
    """Where copies go: under the Hugging Face cache (HF_HOME), beside the models downloaded from the Hub."""
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / CACHE_NAME


def from_bucket(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with a model folder in a bucket (model.name_or_path=gs://.../model) read from its local copy;
    any other as it is."""
    if cfg.name_or_path is None or "://" not in cfg.name_or_path:
        return cfg
    return dataclasses.replace(cfg, name_or_path=str(local_copy(cfg.name_or_path)))


def local_copy(url: str, *, key: str = "model.name_or_path") -> Path:
    """The local copy of the model folder ``url`` (one with config.json), made if this version of it is
    not in the cache yet. ``key`` is the setting that named it, for messages."""
    url = url.rstrip("/")
    storage = Storage(url, key=key)
    objects = _listing(storage)
    if not objects:
        raise ConfigError(f"{key}={url} holds no files: check the path (gcloud storage ls {posixpath.dirname(url)}/)"
                          ", or give a local folder or a Hub id")
    if not any(each.name == "config.json" for each in objects):
        run_folder = any(each.name == f"{contract.MODEL_DIR}/config.json" for each in objects)
        fix = (f"it is a run folder: give its model, {key}={url}/{contract.MODEL_DIR}" if run_folder else
               "give a model folder (a run's model/, or one written by save_pretrained)")
        raise ConfigError(f"{key}={url} holds no config.json, so it is no model folder: {fix}")
    target = cache_dir() / _digest([url])[:16] / _digest(f"{o.name} {o.size} {o.version}" for o in objects)[:16]
    model = target / contract.MODEL_DIR
    if model.is_dir():
        log.info("%s=%s: read from its copy in %s (the folder is unchanged since it was copied)", key, url, model)
        return model
    _copy(storage, objects, target)
    log.info("%s=%s: copied to %s (%d files, %.1f MB)", key, url, model, len(objects),
             sum(each.size for each in objects) / 1e6)
    return model


def _digest(lines: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def _listing(storage: Storage) -> List[Remote]:
    """Every object below the folder, by its path there; on Cloud Storage in one request without
    retries, so that a wrong bucket or no network is answered at once."""
    if not storage.cloud:
        try:
            found = storage.fs.find(storage.root, detail=True)
        except OSError as err:
            raise StorageError(f"{storage.key}={storage.url} cannot be read: {err}") from None
        return [Remote(posixpath.relpath(path, storage.root), int(info.get("size") or 0), _version(info))
                for path, info in sorted(found.items()) if info.get("type") != "directory"]
    prefix = storage.root.partition("/")[2]
    start = len(prefix) + 1 if prefix else 0
    return [Remote(blob.name[start:], int(blob.size or 0), str(blob.generation or blob.etag))
            for blob in storage.blobs() if not blob.name.endswith("/")]


def _version(info: Dict[str, object]) -> str:
    for name in ("generation", "etag", "ETag"):
        if info.get(name):
            return str(info[name])
    return f"{info.get('size')}-{info.get('mtime') or info.get('updated')}"


def _copy(storage: Storage, objects: List[Remote], target: Path) -> None:
    """Copy the objects into ``target/model`` beside it, check them, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp"))
    try:
        for each in objects:
            local = staging / contract.MODEL_DIR / each.name
            local.parent.mkdir(parents=True, exist_ok=True)
            _fetch(storage, each, local)
        _check(storage, staging)
        try:
            os.replace(staging, target)
        except OSError:
            if not (target / contract.MODEL_DIR).is_dir():  # not another process's copy of the same version
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fetch(storage: Storage, remote: Remote, local: Path) -> None:
    try:
        if storage.cloud:
            # Only the version listed: an object rewritten meanwhile fails the copy instead of mixing versions.
            storage.blob(remote.name).download_to_filename(str(local), if_generation_match=_generation(remote),
                                                           timeout=TIMEOUT * 6)
        else:
            storage.fs.get_file(storage.path(remote.name), str(local))
    except Exception as err:
        from google.api_core import exceptions as api

        if isinstance(err, api.PreconditionFailed):
            raise StorageError(f"{storage.describe(remote.name)} was rewritten while it was copied (a run is writing "
                               "the folder): run the command again once it is done") from None
        raise (storage.read_failure(err) if storage.cloud else
               StorageError(f"could not read {storage.describe(remote.name)}: {err}")) from err


def _generation(remote: Remote) -> int | None:
    return int(remote.version) if remote.version.isdigit() else None


def _check(storage: Storage, staging: Path) -> None:
    """The copy against its export.json, as a run folder's export is checked."""
    record_file = staging / contract.MODEL_DIR / contract.EXPORT_FILE
    if not record_file.is_file():
        return  # a model folder this project did not export: nothing to check it against
    try:
        step = json.loads(record_file.read_text()).get("step")
    except (ValueError, AttributeError):
        step = None
    problems = integrity.damage(Storage(str(staging)), step)
    if problems:
        shown = "; ".join(problem.replace(str(staging / contract.MODEL_DIR), storage.url) for problem in problems)
        raise ConfigError(f"{storage.key}={storage.url} is damaged ({shown}): export it again (run its training "
                          "command again with the same output folder), or give another model")
