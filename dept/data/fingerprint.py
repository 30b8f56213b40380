"""Content keys for cached data: what the bytes are, never where they lie.

A cache keyed by a folder's absolute path is rebuilt whenever the corpus or the state
directory moves; one keyed by a full hash of a 10 GB source costs seconds on every client
start. So a file is known by its name, its size and a hash of a bounded sample of its bytes
(its start, its end and blocks spread evenly between): moving or copying a corpus keeps the
key, editing it changes the key unless the edit keeps the size and misses every sampled block.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SAMPLE_BLOCKS = 16  # blocks hashed per file (first and last included)
BLOCK_BYTES = 1 << 16
KEY_CHARS = 20


def digest(*parts: Any) -> str:
    """A short hash of JSON-serialisable ``parts`` (order matters, dict order does not)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_CHARS]


def file_key(path: Path) -> str:
    """``path``'s name, size and the hash of :data:`SAMPLE_BLOCKS` blocks of its bytes."""
    size = path.stat().st_size
    hashed = hashlib.sha256(f"{path.name}\0{size}\0".encode())
    last = max(0, size - BLOCK_BYTES)
    offsets = sorted({last * i // (SAMPLE_BLOCKS - 1) for i in range(SAMPLE_BLOCKS)})
    with path.open("rb") as f:
        for offset in offsets:
            f.seek(offset)
            hashed.update(f.read(BLOCK_BYTES))
    return hashed.hexdigest()[:KEY_CHARS]


def files_key(paths: Iterable[Path]) -> str:
    """One key for files read in this order (their folders do not count)."""
    return digest([file_key(p) for p in paths])
