"""One language, many domains: eight English corpora made from what Debian and npm ship, for
the paper's other setting (its Pile runs: one language, heterogeneous domains).

Each domain is a list of pinned packages and, per package, which files to read and how
(:mod:`benchmarks.corpora.readers`). Documents longer than :data:`CHUNK_CHARS` are cut at line
ends into parts; each document (or part) goes to validation when the SHA-256 of its domain
and id is 0 modulo :data:`VALIDATION_ONE_IN`, otherwise to training; both are taken in the
order of that hash up to ``train_bytes`` and :data:`VAL_BYTES`, so no domain is the first
letters of a dictionary or the first modules of a library.

The build writes ``<domain>/train.txt`` and ``val.txt`` (documents separated by a blank
line), ``sources.yaml`` for ``dept compare``, and ``MANIFEST.json``: every package with its
version and SHA-256, every file read with its SHA-256, and the SHA-256 of every output. With
``pins`` (the committed manifest), a package whose bytes differ stops the build, and the
outputs are compared: a rebuild is bit for bit or says where it is not. Debian keeps only a
stable release's newest security update in its main archive; an older pin is on
snapshot.debian.org.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.corpora import readers
from benchmarks.corpora.artefacts import Artefact, members, sha256

CHUNK_CHARS = 32_000
VALIDATION_ONE_IN = 16
VAL_BYTES = 200_000
TRAIN_BYTES = 4_000_000
VOCAB_SIZE = 4096
# Out of distribution (the paper's mC4 row): quotations and jokes, the one domain of general
# prose, left out of sources-ood.yaml; the seven trained on are reference text and code
OOD_DOMAIN = "en-quotes"
MANIFEST = "MANIFEST.json"


@dataclass(frozen=True)
class Read:
    """Which files of a package a domain reads (a regular expression on their path), how."""

    artefact: Artefact
    files: str
    reader: readers.Reader


def _deb(name: str, version: str) -> Artefact:
    return Artefact("deb", name, version)


def _npm(name: str, version: str) -> Artefact:
    return Artefact("npm", name, version)


DOMAINS: dict[str, list[Read]] = {
    "en-dictionary": [
        Read(_deb("dict-gcide", "0.48.5+nmu2"), r".*/gcide\.dict\.dz", readers.dictd),
    ],
    "en-computing": [
        Read(_deb("dict-foldoc", "20230119-1"), r".*/foldoc\.dict\.dz", readers.dictd),
        Read(_deb("dict-jargon", "4.4.7-3.1"), r".*/jargon\.dict\.dz", readers.dictd),
    ],
    "en-manpages": [
        Read(_deb("manpages", "6.03-2"), r"usr/share/man/.*\.gz", readers.manual_page),
        Read(_deb("manpages-dev", "6.03-2"), r"usr/share/man/.*\.gz", readers.manual_page),
    ],
    "en-pydocs": [
        Read(_deb("python3.11-doc", "3.11.2-6+deb12u9"), r".*/html/.*\.html", readers.html_page),
    ],
    "en-quotes": [
        Read(
            _deb("fortunes", "1:1.99.1-7.3"), r"usr/share/games/fortunes/[^./]+", readers.fortunes
        ),
    ],
    "en-legal": [
        Read(_npm("spdx-license-list", "6.9.0"), r"package/spdx-full\.json", readers.spdx_licences),
    ],
    "code-javascript": [
        Read(_npm("typescript", "5.6.3"), r"package/lib/typescript\.js", readers.source_file),
    ],
    "code-python": [
        Read(
            _deb("libpython3.11-stdlib", "3.11.2-6+deb12u9"),
            r"usr/lib/python3\.11/.*\.py",
            readers.source_file,
        ),
    ],
}


def build(
    out: Path,
    cache: Path,
    domains: dict[str, list[Read]] = DOMAINS,
    train_bytes: int = TRAIN_BYTES,
    pins: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build every domain into ``out`` from packages in ``cache`` (fetched where missing);
    the manifest, also written to ``out``. ``pins``: a manifest to hold the packages and
    outputs to (a ValueError names the first package that differs)."""
    manifest: dict[str, Any] = {"built_by": "python -m benchmarks.corpora build-english"}
    manifest["settings"] = {
        "chunk_chars": CHUNK_CHARS,
        "validation_one_in": VALIDATION_ONE_IN,
        "train_bytes": train_bytes,
        "val_bytes": VAL_BYTES,
    }
    manifest["domains"] = {}
    for name, reads in domains.items():
        manifest["domains"][name] = _build_domain(name, reads, out / name, cache, train_bytes, pins)
        print(f"{name}: {_sizes(manifest['domains'][name])}", flush=True)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    sources = [{"name": n, "path": n, "vocab-size": VOCAB_SIZE} for n in domains]
    _write_sources(out / "sources.yaml", "The English domains", sources)
    trained = [s for s in sources if s["name"] != OOD_DOMAIN]
    _write_sources(out / "sources-ood.yaml", f"All but {OOD_DOMAIN}, held out", trained)
    held = [s for s in sources if s["name"] == OOD_DOMAIN]
    _write_sources(out / "held-out.yaml", "The domain no run of sources-ood.yaml trains on", held)
    return manifest


def _write_sources(path: Path, what: str, sources: list[dict[str, Any]]) -> None:
    path.write_text(
        f"# {what} (python -m benchmarks.corpora build-english)\nsources:\n"
        + "".join(f"  - {json.dumps(s)}\n" for s in sources)
    )


def _build_domain(
    name: str,
    reads: list[Read],
    out: Path,
    cache: Path,
    train_bytes: int,
    pins: dict[str, Any] | None,
) -> dict[str, Any]:
    packages: list[dict[str, str]] = []
    files: list[dict[str, str]] = []
    documents: list[tuple[str, str]] = []
    for read in reads:
        path = read.artefact.fetch(cache)
        digest = sha256(path.read_bytes())
        _hold(pins, name, read.artefact.label, digest)
        packages.append({"package": read.artefact.label, "file": path.name, "sha256": digest})
        contents = dict(members(path))
        for member in sorted(p for p in contents if re.fullmatch(read.files, p)):
            files.append({"package": read.artefact.label, "path": member})
            files[-1]["sha256"] = sha256(contents[member])
            for doc_id, text in read.reader(member, contents[member], contents):
                documents.extend(_parts(doc_id, text))
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"packages": packages, "files": files}
    for split, cap in (("train", train_bytes), ("val", VAL_BYTES)):
        chosen = _take(_in_split(name, documents, split), cap)
        data = "\n\n".join(text.strip("\n") for _, text in chosen).encode() + b"\n"
        (out / f"{split}.txt").write_bytes(data)
        record[f"{split}.txt"] = {"bytes": len(data), "sha256": sha256(data)}
        record[f"{split}_documents"] = len(chosen)
        _hold_output(pins, name, f"{split}.txt", record[f"{split}.txt"]["sha256"])
    return record


def _parts(doc_id: str, text: str) -> Iterator[tuple[str, str]]:
    """``text`` whole, or cut at line ends into parts of at most about CHUNK_CHARS."""
    if len(text) <= CHUNK_CHARS:
        yield doc_id, text
        return
    part: list[str] = []
    size = number = 0
    for line in text.splitlines(keepends=True):
        if size + len(line) > CHUNK_CHARS and part:
            yield f"{doc_id}#part{number}", "".join(part)
            part, size, number = [], 0, number + 1
        part.append(line)
        size += len(line)
    if part:
        yield f"{doc_id}#part{number}", "".join(part)


def _key(domain: str, doc_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{domain}\0{doc_id}".encode()).digest()[:8], "big")


def _in_split(domain: str, documents: list[tuple[str, str]], split: str) -> list[tuple[str, str]]:
    """The documents of ``split``, in the order of their hash."""
    keyed = sorted((_key(domain, i), i, t) for i, t in documents if t.strip())
    wanted = split == "val"
    return [(i, t) for k, i, t in keyed if (k % VALIDATION_ONE_IN == 0) == wanted]


def _take(documents: list[tuple[str, str]], cap: int) -> list[tuple[str, str]]:
    chosen, size = [], 0
    for doc_id, text in documents:
        if size >= cap:
            break
        chosen.append((doc_id, text))
        size += len(text.strip("\n").encode()) + 2  # as written: a blank line between
    return chosen


def _hold(pins: dict[str, Any] | None, domain: str, label: str, digest: str) -> None:
    if pins is None or domain not in pins["domains"]:
        return
    pinned = {p["package"]: p["sha256"] for p in pins["domains"][domain]["packages"]}
    if label in pinned and pinned[label] != digest:
        raise ValueError(
            f"{domain}: {label} has SHA-256 {digest}, the manifest pins {pinned[label]}"
        )


def _hold_output(pins: dict[str, Any] | None, domain: str, name: str, digest: str) -> None:
    if pins is None or domain not in pins["domains"]:
        return
    pinned = pins["domains"][domain][name]["sha256"]
    if pinned != digest:
        raise ValueError(
            f"{domain}/{name} has SHA-256 {digest}, the manifest has {pinned}: the same "
            "packages gave other text (a reader changed?)"
        )


def _sizes(record: dict[str, Any]) -> str:
    return (
        f"{record['train.txt']['bytes']:,} bytes train ({record['train_documents']} documents), "
        f"{record['val.txt']['bytes']:,} validation ({record['val_documents']})"
    )
