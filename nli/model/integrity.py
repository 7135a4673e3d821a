"""An exported model folder's integrity: each file's size and SHA-256, recorded in ``model/export.json``
as it is written (nli/output/export.py), and the folder checked against them wherever it is read again
(a finished run's, or a copy of one from a bucket: nli/model/bucket.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from nli import contract
from nli.errors import ConfigError
from nli.io.storage import Storage, digest

WEIGHT_FILES = (".safetensors", ".bin")  # a model folder's weights, whole or in shards


def digests(local: Path) -> Dict[str, Dict[str, Any]]:
    """Each file under ``local`` (by its ``/``-separated path there): its size and SHA-256."""
    found: Dict[str, Dict[str, Any]] = {}
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        with path.open("rb") as f:
            size, sha256 = digest(f)
        found[path.relative_to(local).as_posix()] = {"size": size, "sha256": sha256}
    return found


def damage(storage: Storage, step: Optional[int], *, folder: str = contract.MODEL_DIR) -> List[str]:
    """What is wrong with the export in ``folder`` (``model/``; none where it is whole): checked against its
    export.json, which must be of ``step``. An export.json without its files' digests (written before it
    recorded them) has nothing to check them against: it is taken as it is."""
    name = f"{folder}/{contract.EXPORT_FILE}"
    record_name = storage.describe(name)
    if not storage.list(folder):
        return [f"{storage.describe(folder)} is missing"]
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
            if (problem := _file_damage(storage, f"{folder}/{file}", expected))]


def scored(name_or_path: str, *, key: str = "model.name_or_path") -> Dict[str, Any]:
    """Which weights an evaluation of the local model folder ``name_or_path`` scores, for its results.json: the
    step it was exported at (where this project exported it: its export.json) and each weights file's SHA-256.
    An export is first checked against its export.json: a file missing, cut short or changed since (a
    tokenizer file lost, bytes flipped in the weights) is a ConfigError, not an evaluation of something else.
    Empty for a Hub id."""
    model_dir = Path(name_or_path).expanduser()
    if not model_dir.is_dir():
        return {}
    step: Optional[int] = None
    recorded: Dict[str, Any] = {}
    if (model_dir / contract.EXPORT_FILE).is_file():
        storage = Storage(str(model_dir.parent))
        try:
            record = json.loads((model_dir / contract.EXPORT_FILE).read_text())
            step, recorded = record.get("step"), record.get("files") or {}
        except (ValueError, AttributeError):
            pass  # damage() names it
        problems = damage(storage, step, folder=model_dir.name)
        if problems:
            raise ConfigError(f"{key}={name_or_path} is an exported model that is damaged ({'; '.join(problems)}): "
                              "export it again (run its training command again with the same output folder), or "
                              "give another model")
    weights = sorted(p for p in model_dir.iterdir() if p.suffix in WEIGHT_FILES and p.is_file())
    return {"step": step, "sha256": {p.name: recorded.get(p.name, {}).get("sha256") or _sha256(p) for p in weights}}


def changes(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> List[str]:
    """How the weights :func:`scored` gives ``now`` differ from the ``recorded`` ones, file by file (its SHA-256,
    shortened); none where they are the same."""
    old, new = recorded.get("sha256") or {}, now.get("sha256") or {}
    return [f"{name}: {_short(old.get(name))} -> {_short(new.get(name))}" for name in sorted({*old, *new})
            if old.get(name) != new.get(name)]


def _short(sha256: Optional[str]) -> str:
    return "(none)" if sha256 is None else f"SHA-256 {sha256[:12]}"


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return digest(f)[1]


def _file_damage(storage: Storage, name: str, expected: Any) -> Optional[str]:
    """What is wrong with file ``name`` against its ``expected`` size and SHA-256; None if nothing is."""
    try:
        with storage.fs.open(storage.path(name), "rb") as f:
            size, sha256 = digest(f)
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
