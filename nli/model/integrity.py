"""An exported model folder's integrity: each file's size and SHA-256, recorded in ``model/export.json``
as it is written (nli/output/export.py), and the folder checked against them wherever it is read again
(a finished run's, or a copy of one from a bucket: nli/model/bucket.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Tuple

from nli import contract
from nli.io.storage import Storage


def digests(local: Path) -> Dict[str, Dict[str, Any]]:
    """Each file under ``local`` (by its ``/``-separated path there): its size and SHA-256."""
    found: Dict[str, Dict[str, Any]] = {}
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        with path.open("rb") as f:
            size, sha256 = _hashed(f)
        found[path.relative_to(local).as_posix()] = {"size": size, "sha256": sha256}
    return found


def _hashed(f: IO[bytes]) -> Tuple[int, str]:
    """The size and SHA-256 of what ``f`` holds, read in blocks: a large model is never whole in memory."""
    sha, size = hashlib.sha256(), 0
    while block := f.read(1 << 20):
        sha.update(block)
        size += len(block)
    return size, sha.hexdigest()


def damage(storage: Storage, step: int) -> List[str]:
    """What is wrong with the export in ``model/`` (none where it is whole): checked against export.json,
    which must be of ``step``. An export.json without its files' digests (written before it recorded
    them) has nothing to check them against: it is taken as it is."""
    name = f"{contract.MODEL_DIR}/{contract.EXPORT_FILE}"
    record_name = storage.describe(name)
    if not storage.list(contract.MODEL_DIR):
        return [f"{storage.describe(contract.MODEL_DIR)} is missing"]
    try:
        record = json.loads(storage.read_bytes(name))
    except FileNotFoundError:
        return [f"{record_name} is missing"]
    except (OSError, ValueError) as err:
        return [f"{record_name} cannot be read ({err})"]
    if not isinstance(record, dict) or not isinstance(record.get("files", {}), dict):
        return [f"{record_name} cannot be read (not the object an export writes)"]
    if record.get("step") != step:
        return [f"{record_name} says step {record.get('step')}, where results.json names step {step} the best"]
    files = record.get("files")
    if files is None:  # written before export.json recorded its files
        return []
    return [problem for file, expected in sorted(files.items())
            if (problem := _file_damage(storage, f"{contract.MODEL_DIR}/{file}", expected))]


def _file_damage(storage: Storage, name: str, expected: Any) -> Optional[str]:
    """What is wrong with file ``name`` against its ``expected`` size and SHA-256; None if nothing is."""
    try:
        with storage.fs.open(storage.path(name), "rb") as f:
            size, sha256 = _hashed(f)
    except FileNotFoundError:
        return f"{storage.describe(name)} is missing"
    except (IsADirectoryError, NotADirectoryError):
        return f"{storage.describe(name)} is not a file"
    exported_size = expected.get("size") if isinstance(expected, dict) else None
    if size != exported_size:
        return f"{storage.describe(name)} has {size} bytes, where {exported_size} were exported"
    if sha256 != expected.get("sha256"):
        return f"{storage.describe(name)} is corrupt (its SHA-256 differs from the one export.json records)"
    return None
