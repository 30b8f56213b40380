"""MosaicML Streaming (MDS) shards as a source: the text column of a folder ``MDSWriter`` wrote.

MDS is the format the DEPT authors' lineage (Photon, llm-foundry) trains from. Its reader,
``mosaicml-streaming``, pins numpy < 2.2 and transformers < 5 and cannot be installed beside
this project, so the format is read here; it is small. A folder holds ``index.json`` (format
version 2), which lists the shards and their columns, and the shard files. A shard is the
sample count (uint32), the samples' ``count + 1`` byte offsets (uint32), and the samples; a
sample is the byte size (uint32) of each column without a fixed size, then the columns'
bytes, in the index's column order. A shard may be compressed whole (``compression`` names
the codec, ``zip_data`` the file): gz and bz2 are Python's own, br, snappy and zstd come with
the ``mds`` extra (``cramjam``).

Only the text column is ever decoded, and only as UTF-8: a column of another encoding is
refused, and none is unpickled. A shard is read whole (MDS bounds its size, 64 MiB by
default) and its documents handed on one by one, so memory follows the shard, not the source.
"""

from __future__ import annotations

import bz2
import gzip
import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

INDEX = "index.json"
TEXT_ENCODING = "str"  # MDS's UTF-8 text
EXTRA = "pip install 'dept-flower[mds]'"


class MdsError(ValueError):
    """An MDS folder that cannot be read, with what is wrong and where."""


@dataclass(frozen=True)
class Shard:
    """One shard as ``index.json`` lists it."""

    file: Path  # as it lies on disk: the compressed file where there is one
    codec: str  # "" where not compressed
    size: int  # the bytes ``file`` should have
    samples: int
    columns: tuple[str, ...]
    encodings: tuple[str, ...]
    sizes: tuple[int | None, ...]  # a column's fixed size, None where each sample says


def is_mds(folder: Path) -> bool:
    """Whether ``folder`` holds an MDS index (not merely some ``index.json``)."""
    try:
        index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    shards = index.get("shards") if isinstance(index, dict) else None
    return isinstance(shards, list) and all(
        isinstance(s, dict) and s.get("format") == "mds" for s in shards
    )


def split_folders(root: Path) -> list[str]:
    """The subfolders of ``root`` that are MDS folders: its splits (``train``, ``val``...)."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and is_mds(p))


def shards(folder: Path) -> list[Shard]:
    """The shards ``folder``'s index lists, each checked to be there at its listed size."""
    path = folder / INDEX
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        listed = index["shards"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MdsError(f"{path} is not an MDS index ({exc})") from None
    found = [_shard(folder, entry, number) for number, entry in enumerate(listed)]
    if not found:
        raise MdsError(f"{path} lists no shards")
    return found


def _shard(folder: Path, entry: dict, number: int) -> Shard:
    where = f"{folder / INDEX}, shard {number}"
    if entry.get("format") != "mds" or entry.get("version") != 2:
        raise MdsError(
            f"{where} is format {entry.get('format')!r} version {entry.get('version')!r}; "
            "only MDS version 2 is read"
        )
    data = entry.get("zip_data") or entry["raw_data"]
    codec = (entry.get("compression") or "").split(":")[0] if entry.get("zip_data") else ""
    shard = Shard(
        file=folder / data["basename"],
        codec=codec,
        size=int(data["bytes"]),
        samples=int(entry["samples"]),
        columns=tuple(entry["column_names"]),
        encodings=tuple(entry["column_encodings"]),
        sizes=tuple(entry["column_sizes"]),
    )
    if not shard.file.is_file():
        raise MdsError(f"{shard.file} is missing ({where} lists it)")
    actual = shard.file.stat().st_size
    if actual != shard.size:
        raise MdsError(
            f"{shard.file} has {actual:,} bytes, its index says {shard.size:,}: cut short?"
        )
    return shard


def check_text_column(folder: Path, column: str) -> None:
    """Refuse, before any reading, a text column that is not in every shard or not text."""
    for shard in shards(folder):
        if column not in shard.columns:
            pairs = zip(shard.columns, shard.encodings, strict=True)
            found = ", ".join(f"{name} ({encoding})" for name, encoding in pairs)
            raise MdsError(
                f"no column {column!r} in {folder} (columns: {found}); set 'text-column'"
            )
        encoding = shard.encodings[shard.columns.index(column)]
        if encoding != TEXT_ENCODING:
            raise MdsError(
                f"column {column!r} of {folder} is {encoding}, not text ({TEXT_ENCODING}): each "
                "source tokenizes text with its own vocabulary, so shards of another "
                "tokenizer's ids cannot be read; write the text as a str column"
            )


def texts(folder: str, column: str) -> Iterator[dict[str, str]]:
    """Every sample's ``column``, shard by shard in the index's order, as ``{"text": ...}``
    rows (the form ``datasets.Dataset.from_generator`` takes)."""
    for shard in shards(Path(folder)):
        for text in _shard_texts(shard, column):
            yield {"text": text}


def _shard_texts(shard: Shard, column: str) -> Iterator[str]:
    data = _decompress(shard)
    try:
        (count,) = struct.unpack_from("<I", data)
        offsets = struct.unpack_from(f"<{count + 1}I", data, 4)
    except struct.error:
        raise MdsError(f"{shard.file} is damaged: its sample offsets are cut short") from None
    if count != shard.samples:
        raise MdsError(f"{shard.file} holds {count} samples, its index says {shard.samples}")
    which = shard.columns.index(column)
    unsized = [i for i, size in enumerate(shard.sizes) if size is None]
    for number, (begin, end) in enumerate(pairwise(offsets)):
        sample = memoryview(data)[begin:end]
        sizes = list(shard.sizes)
        try:
            for i, size in zip(
                unsized, struct.unpack_from(f"<{len(unsized)}I", sample), strict=True
            ):
                sizes[i] = size
        except struct.error:
            raise MdsError(f"{shard.file}, sample {number}: damaged, its sizes cut short") from None
        start = 4 * len(unsized) + sum(s or 0 for s in sizes[:which])
        raw = bytes(sample[start : start + (sizes[which] or 0)])
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MdsError(
                f"{shard.file}, sample {number}: column {column!r} is not UTF-8 ({exc.reason})"
            ) from None


def _decompress(shard: Shard) -> bytes:
    raw = shard.file.read_bytes()
    if not shard.codec:
        return raw
    decompress = DECOMPRESS.get(shard.codec)
    if decompress is None:
        raise MdsError(f"{shard.file} is compressed with {shard.codec!r}, which MDS does not write")
    try:
        return decompress(raw)
    except ImportError:
        raise MdsError(f"{shard.file} is compressed with {shard.codec}: {EXTRA} reads it") from None
    except Exception as exc:  # each codec fails in its own way on a damaged file
        raise MdsError(f"{shard.file} cannot be decompressed as {shard.codec}: {exc}") from None


def _cramjam(codec: str) -> Callable[[bytes], bytes]:
    """A codec of ``cramjam`` (the ``mds`` extra), imported when a shard needs it."""

    def decompress(raw: bytes) -> bytes:
        import cramjam

        module = getattr(cramjam, codec)
        # MDS's snappy is the raw block format (python-snappy's compress), not the framed one
        unpack = module.decompress_raw if codec == "snappy" else module.decompress
        return bytes(unpack(raw))

    return decompress


DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gz": gzip.decompress,
    "bz2": bz2.decompress,
    "br": _cramjam("brotli"),
    "snappy": _cramjam("snappy"),
    "zstd": _cramjam("zstd"),
}
