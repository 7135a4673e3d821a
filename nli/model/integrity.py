"""An exported model folder's integrity: each file's size and SHA-256, recorded in ``model/export.json``
as it is written (nli/output/export.py), and the folder checked against them wherever it is read again
(a finished run's, or a copy of one from a bucket: nli/model/bucket.py)."""

from __future__ import annotations

import json
import zipfile
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
    tokenizer file lost, bytes flipped in the weights) is a ConfigError, not an evaluation of something else; so is
    a file of any model folder that cannot be read as what its name says (weights or tokenizer.json cut short in a
    copy), named, where transformers gave a traceback. Empty for a Hub id."""
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
    unreadable = [problem for path in sorted(model_dir.iterdir()) if path.is_file() and (problem := _unreadable(path))]
    if unreadable:  # a folder with no export.json to check it against (a checkpoint, a copy), or one that lies
        raise ConfigError(f"{key}={name_or_path} holds a file that cannot be read ({'; '.join(unreadable)}): it was "
                          "cut short or damaged in a copy. Copy the model folder again whole (or save the model "
                          "again), or give another model")
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


def _unreadable(path: Path) -> Optional[str]:
    """Why ``path``, a file of a model folder, cannot be read as what its name says (a safetensors file, a PyTorch
    zip archive, JSON, a tokenizer), where something can be told without loading it; None where nothing is wrong.
    Transformers and tokenizers said it in a traceback (a JSONDecodeError, "incomplete metadata, file not fully
    covered") or, for some files, loaded what they could without a word."""
    try:
        if path.suffix == ".safetensors":
            return _safetensors_problem(path)
        if path.suffix == ".bin":
            with path.open("rb") as f:
                zipped = f.read(4) == b"PK\x03\x04"  # torch.save's archive; the older pickle is not told here
            return f"{path} is cut short (not a whole zip archive)" if zipped and not zipfile.is_zipfile(path) else None
        if path.suffix == ".json":
            json.loads(path.read_bytes())
            if path.name == "tokenizer.json":
                from tokenizers import Tokenizer  # Rust: what transformers builds a fast tokenizer from

                Tokenizer.from_file(str(path))
    except ValueError as err:  # not JSON (a JSONDecodeError), not UTF-8
        return f"{path} is not JSON ({err})"
    except OSError as err:
        return f"{path} cannot be read ({err.strerror or err})"
    except Exception as err:  # tokenizers' own error: valid JSON that is no tokenizer
        return f"{path} is not a tokenizer ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    return None


def _safetensors_problem(path: Path) -> Optional[str]:
    """What is wrong with a safetensors file: its 8-byte header length, its JSON header, and the tensors' data the
    header describes, which must fill the rest of the file exactly (as safetensors itself checks)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else None
        if length is None or length > size - 8:
            return f"{path} is cut short ({size} bytes, less than its safetensors header)"
        header = json.loads(f.read(length))
    try:
        ends = [int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"]
    except (AttributeError, KeyError, TypeError, IndexError, ValueError):
        ends = []
    if not ends:
        return f"{path} is not a safetensors file (its header describes no tensors)"
    expected = 8 + length + max(ends)
    if expected != size:
        return (f"{path} has {size} bytes, where its header describes {expected}: it is "
                f"{'cut short' if size < expected else 'damaged'}")
    return None


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
