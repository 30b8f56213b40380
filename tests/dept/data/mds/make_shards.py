"""Writes the MDS folders the tests read, with MosaicML's own writer (``streaming.MDSWriter``).

The folders are committed: ``mosaicml-streaming`` pins numpy < 2.2 and transformers < 5, so
it cannot be installed beside this project. To write them again, in a venv of their own::

    pip install mosaicml-streaming
    python tests/dept/data/mds/make_shards.py tests/dept/data/mds   # its folders removed first
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from streaming import MDSWriter, StreamingDataset

SHARD_BYTES = 4096  # small shards, so that every folder has several
COMPRESSIONS = ("br", "bz2", "gz", "snappy", "zstd")  # every one MDSWriter knows


def documents(count: int, word: str) -> list[str]:
    """Documents a tokenizer can learn from; the ``ü`` and ``→`` check the UTF-8 decoding."""
    return [f"{word} {i}: über die Brücke → {i % 7} Uhr. " * 4 for i in range(count)]


def write(folder: Path, columns: dict[str, str], samples: list[dict], codec: str | None) -> None:
    with MDSWriter(
        out=str(folder), columns=columns, compression=codec, size_limit=SHARD_BYTES
    ) as writer:
        for sample in samples:
            writer.write(sample)


def main(root: Path) -> None:
    texts = documents(120, "document")
    rows = [{"text": t, "id": i} for i, t in enumerate(texts)]
    write(root / "plain", {"text": "str", "id": "int"}, rows, None)
    for codec in COMPRESSIONS:
        write(root / "compressed" / codec, {"text": "str", "id": "int"}, rows[:30], codec)
    val = documents(20, "held")
    write(root / "splits" / "train", {"text": "str"}, [{"text": t} for t in texts], None)
    write(root / "splits" / "val", {"text": "str"}, [{"text": t} for t in val], None)
    tokens = [{"tokens": np.arange(i, i + 16, dtype=np.int32)} for i in range(20)]
    write(root / "tokens", {"tokens": "ndarray:int32"}, tokens, None)
    write_read_back(root)


def write_read_back(root: Path) -> None:
    """``read_back.json``: each text folder's texts as MosaicML's own reader gives them, in
    order; the tests hold this project's reader to it."""
    folders = sorted(p.parent for p in root.rglob("index.json") if p.parent.name != "tokens")
    read_back = {}
    for folder in folders:
        dataset = StreamingDataset(local=str(folder), shuffle=False, batch_size=1)
        texts = [dataset[i]["text"] for i in range(len(dataset))]
        read_back[folder.relative_to(root).as_posix()] = texts
    (root / "read_back.json").write_text(json.dumps(read_back, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
