"""Cheap checks of a source's local files, so bad data fails with one line naming the file.

A node sniffs the start of each file before any training (:func:`file_problem`); sources may
be many GB, so only the first :data:`SNIFF_BYTES` are read. When ``datasets`` later fails
deeper in a file, ``whole=True`` checks the whole file for invalid UTF-8 to say where it is.
Messages are one line: the server shows the last line of a client's error.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterable
from itertools import chain
from pathlib import Path

SNIFF_BYTES = 64 * 1024
READ_BYTES = 1 << 20  # chunk size of a whole-file scan
TEXT_SUFFIXES = (".txt", ".json", ".jsonl", ".csv")  # the others (parquet, arrow) are binary


def file_problem(path: Path, whole: bool = False) -> str | None:
    """What is wrong with ``path`` as a data file ("is empty", ...), or None.

    Judged from its first 64 KiB (text formats: NUL bytes, UTF-8, all blank); ``whole``
    extends the UTF-8 check to the whole file.
    """
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(SNIFF_BYTES)
            if not head:
                return "is empty"
            if path.suffix.lower() not in TEXT_SUFFIXES:
                return None
            if b"\0" in head:
                return "looks binary (NUL bytes in its first 64 KiB)"
            at_end = size <= len(head)
            rest = iter(lambda: f.read(READ_BYTES), b"") if whole and not at_end else ()
            bad = utf8_problem(chain([head], rest), final=at_end or whole)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if bad:
        return bad
    if at_end and not head.decode("utf-8").strip():
        return "has no text (only whitespace)"
    return None


def utf8_problem(chunks: Iterable[bytes], final: bool) -> str | None:
    """Where ``chunks`` (consecutive bytes) stop being UTF-8, or None.

    Without ``final`` a multi-byte character cut at the end is left pending, not flagged:
    the sniff cuts a file at an arbitrary byte.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    steps = chain(((c, False) for c in chunks), [(b"", True)] if final else [])
    offset = 0  # file offset of the next chunk
    for chunk, last in steps:
        pending = decoder.getstate()[0]  # bytes of a character cut at the previous chunk's end
        try:
            decoder.decode(chunk, final=last)
        except UnicodeDecodeError as exc:  # exc.object is pending + chunk
            return decode_error_text(exc, offset - len(pending))
        offset += len(chunk)
    return None


def decode_error_text(exc: UnicodeDecodeError, base: int = 0) -> str:
    """``exc`` as "is not UTF-8 text (...)"; ``base`` is the file offset of ``exc.object``."""
    byte = exc.object[exc.start]
    return f"is not UTF-8 text (invalid byte 0x{byte:02x} at offset {base + exc.start})"


def one_line(text: str, limit: int = 300) -> str:
    """``text`` with its whitespace runs (newlines too) collapsed, cut to ``limit`` chars."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
