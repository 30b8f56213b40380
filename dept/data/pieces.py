"""Documents of any length, in bounded pieces: what keeps memory and time flat on one that is
megabytes long with no newline.

A fast tokenizer holds many bytes per character of what it is handed at once, and its BPE
trainer spends time that grows with the square of a word's length. So a document is encoded
a piece of at most :data:`PIECE_CHARS` at a time (cut before whitespace where the piece has
any, so words stay whole but for one cut in a run of that many characters without a space),
and the tokenizer's training sample also cuts any run of more than :data:`WORD_CHARS`
characters without whitespace: real words do not come near it, while a megabyte of one
character would keep the trainer busy for hours.

A document larger than :data:`MAX_DOCUMENT_BYTES` is refused before it is read
(:func:`longest_document`): ``datasets`` loads a document whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

PIECE_CHARS = 1 << 16
WORD_CHARS = 4096  # the corpora here have words of at most 1,472 characters
MAX_DOCUMENT_BYTES = 64 << 20
LONG_WORD = re.compile(rf"\S{{{WORD_CHARS + 1},}}")
SCAN_BYTES = 1 << 20


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` in consecutive pieces of at most ``size`` characters, each cut just before
    the last whitespace of its window where there is one (byte-level BPE starts a word at its
    leading space, so the words come out as from the whole); they join back to ``text``."""
    start = 0
    while len(text) - start > size:
        window = text[start : start + size]
        cut = max(window.rfind(" "), window.rfind("\n"), window.rfind("\t"))
        stop = start + cut if cut > 0 else start + size
        yield text[start:stop]
        start = stop
    if start < len(text) or not text:
        yield text[start:]


def training_pieces(text: str) -> Iterator[str]:
    """``text`` for a tokenizer's trainer: :func:`pieces`, with every run of more than
    :data:`WORD_CHARS` characters without whitespace cut into runs of that many."""
    for piece in pieces(text):
        start = 0
        for match in LONG_WORD.finditer(piece):
            if match.start() > start:
                yield piece[start : match.start()]
            run = match.group()
            yield from (run[i : i + WORD_CHARS] for i in range(0, len(run), WORD_CHARS))
            start = match.end()
        if start < len(piece):
            yield piece[start:]


def longest_document(path: Path, separator: bytes | None) -> tuple[int, int]:
    """(bytes, number from 1) of the longest document in ``path``, read a megabyte at a
    time: documents end at ``separator`` (``b"\\n"``: a line; ``b"\\n\\n"``: a paragraph;
    None: the file is one document)."""
    if separator is None:
        return path.stat().st_size, 1
    longest, where, number, start, base, carry = 0, 1, 1, 0, 0, b""
    with path.open("rb") as f:
        while chunk := f.read(SCAN_BYTES):
            data = carry + chunk  # a separator may straddle the chunks
            newline = np.frombuffer(data, np.uint8) == ord("\n")
            ends = np.flatnonzero(newline if len(separator) == 1 else newline[:-1] & newline[1:])
            for end in (base + int(e) for e in ends):
                if end < start:  # the tail of one just counted ("\n\n\n")
                    continue
                if end - start > longest:
                    longest, where = end - start, number
                number, start = number + 1, end + len(separator)
            carry = data[-(len(separator) - 1) :] if len(separator) > 1 else b""
            base += len(data) - len(carry)
    end = base + len(carry)
    return (end - start, number) if end - start > longest else (longest, where)
