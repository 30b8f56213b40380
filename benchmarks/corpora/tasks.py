"""Downstream tasks made offline from a corpus set's held-out text, for ``dept finetune``.

Every task reads only the sources' validation split, which no run trains on, cut into
consecutive chunks of about ``CHUNK_BYTES`` bytes. Each source's chunks are split by
position: the first ``1 - TEST_SHARE`` go to the train split and the rest to the test split,
so no test text sits beside a train chunk of the same passage.

| task | input | label |
|---|---|---|
| ``which-source`` | one chunk | the source it comes from (sources drawn uniformly) |
| ``chunk-order`` | two adjacent chunks | 1 in their order, 0 swapped |
| ``continuation`` | a chunk, another of its source | 1 the one after it, 0 one from elsewhere |

They ask, in the order of the table, what a body knows of the sources' registers and scripts,
of a text's direction, and of its local coherence. They are stand-ins for the paper's GLUE
and RACE tasks where those files cannot be had. The classes are balanced by construction.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path

from dept.data.corpus import load_source_text
from dept.data.sources import SourceSpec, load_sources

CHUNK_BYTES = 100  # two chunks, a pair task's input, fit a context of 64 tokens
TEST_SHARE = 0.2
Row = dict[str, object]
Chunks = dict[str, list[str]]  # a source's chunks in text order


def source_chunks(spec: SourceSpec, cache: Path, seed: int) -> list[str]:
    """``spec``'s validation text in consecutive chunks of about ``CHUNK_BYTES`` of UTF-8,
    whitespace folded; a document's last piece under half of that is dropped."""
    out = []
    for document in load_source_text(spec, cache, seed).validation["text"]:
        out += [
            p for p in pieces(" ".join(document.split())) if len(p.encode()) >= CHUNK_BYTES // 2
        ]
    return out


def pieces(text: str) -> list[str]:
    """``text`` cut between characters every ``CHUNK_BYTES`` bytes or so. Bytes, not
    characters: a chunk of Chinese holds about as many tokens as one of English."""
    out, start, size = [], 0, 0
    for i, char in enumerate(text):
        size += len(char.encode())
        if size >= CHUNK_BYTES:
            out.append(text[start : i + 1])
            start, size = i + 1, 0
    return [*out, text[start:]] if start < len(text) else out


def split_by_position(chunks: list[str]) -> tuple[list[str], list[str]]:
    cut = int(len(chunks) * (1 - TEST_SHARE))
    return chunks[:cut], chunks[cut:]


def which_source(per_source: Chunks, count: int, rng: random.Random) -> list[Row]:
    names = sorted(per_source)
    rows: list[Row] = []
    for i in range(count):
        label = i % len(names)  # uniform over sources whatever their sizes
        rows.append({"sentence": rng.choice(per_source[names[label]]), "label": label})
    return rows


def _pairs(
    per_source: Chunks,
    count: int,
    rng: random.Random,
    pair: Callable[[list[str], int, bool, random.Random], tuple[str, str]],
) -> list[Row]:
    """``count`` pair examples, sources in turn and the two labels alternating per turn:
    ``pair(chunks, at, positive, rng)`` makes one from a source's chunk ``at``."""
    rows: list[Row] = []
    names = sorted(per_source)
    for i in range(count):
        chunks = per_source[names[i % len(names)]]
        at = rng.randrange(len(chunks) - 1)
        label = i // len(names) % 2
        first, second = pair(chunks, at, bool(label), rng)
        rows.append({"sentence1": first, "sentence2": second, "label": label})
    return rows


def _ordered(chunks: list[str], at: int, positive: bool, rng: random.Random) -> tuple[str, str]:
    """Two adjacent chunks, in their order or swapped."""
    return (chunks[at], chunks[at + 1]) if positive else (chunks[at + 1], chunks[at])


def _continued(chunks: list[str], at: int, positive: bool, rng: random.Random) -> tuple[str, str]:
    """A chunk and the one after it, or one from further away in the same source."""
    if positive:
        return chunks[at], chunks[at + 1]
    other = rng.choice([j for j in range(len(chunks)) if abs(j - at) > 1] or [at + 1])
    return chunks[at], chunks[other]


def chunk_order(per_source: Chunks, count: int, rng: random.Random) -> list[Row]:
    return _pairs(per_source, count, rng, _ordered)


def continuation(per_source: Chunks, count: int, rng: random.Random) -> list[Row]:
    return _pairs(per_source, count, rng, _continued)


TASKS: dict[str, Callable[[Chunks, int, random.Random], list[Row]]] = {
    "which-source": which_source,
    "chunk-order": chunk_order,
    "continuation": continuation,
}


def build_tasks(
    sources_file: Path, out: Path, *, train: int, test: int, seed: int = 0
) -> dict[str, object]:
    """Write every task of :data:`TASKS` under ``out`` (``<task>/train.jsonl``,
    ``test.jsonl``) and ``out/tasks.json``: how they were made, and each file's SHA-256."""
    specs = load_sources(sources_file)
    chunks = {s.name: source_chunks(s, out / ".cache", seed) for s in specs}
    short = [name for name, c in chunks.items() if len(c) < 10]
    if short:
        raise ValueError(f"too little validation text to make tasks from: {', '.join(short)}")
    splits = {name: split_by_position(c) for name, c in chunks.items()}
    files: dict[str, str] = {}
    for task, make in TASKS.items():
        for split, count, index in (("train", train, 0), ("test", test, 1)):
            rng = random.Random(f"{seed}:{task}:{split}")
            rows = make({n: parts[index] for n, parts in splits.items()}, count, rng)
            path = out / task / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            files[f"{task}/{split}.jsonl"] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest: dict[str, object] = {
        "sources_file": str(sources_file),
        "which_source_labels": sorted(chunks),  # the sources, label 0 first
        "chunk_bytes": CHUNK_BYTES,
        "test_share": TEST_SHARE,
        "seed": seed,
        "examples": {"train": train, "test": test},
        "sha256": files,
    }
    (out / "tasks.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
