"""Read the records of an offline W&B run file (``run-<id>.wandb``).

The file is W&B's own: a 7-byte header (``:W&B``, magic, version), then LevelDB's log format
(32 KiB blocks of checksum, length, type, data) around ``wandb_internal_pb2.Record`` protobufs.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterator

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    raw = path.read_bytes()
    assert raw[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(raw):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _checksum, length, kind = struct.unpack("<IHB", raw[pos:pos + HEADER])
        pending += raw[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record
