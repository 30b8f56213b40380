"""The packages a corpus is made from: fetched by version from Debian, npm or PyPI into a
cache, checked against the SHA-256 the manifest pins, and read file by file without
unpacking them to disk.

A ``.deb`` is an ar archive whose ``data.tar.*`` holds the files; npm's ``.tgz`` and PyPI's
sdists are tarballs. Reading them here (the ar header is 60 bytes a member) keeps the build
the same on any machine with Python, whatever its dpkg or tar.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

AR_MAGIC = b"!<arch>\n"
AR_HEADER = 60


@dataclass(frozen=True)
class Artefact:
    """One package at one version from one registry: ``deb``, ``npm`` or ``pypi``."""

    kind: str
    name: str
    version: str

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}={self.version}"

    def fetch(self, cache: Path) -> Path:
        """The package file in ``cache``, downloaded once (apt-get download, npm pack, pip
        download: each needs only its registry)."""
        cache.mkdir(parents=True, exist_ok=True)
        found = self._cached(cache)
        if found is not None:
            return found
        pin = f"{self.name}=={self.version}"
        command = {
            "deb": ["apt-get", "download", f"{self.name}={self.version}"],
            "npm": ["npm", "pack", f"{self.name}@{self.version}", "--silent"],
            "pypi": ["pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", ".", pin],
        }[self.kind]
        subprocess.run(command, cwd=cache, check=True, capture_output=True)
        found = self._cached(cache)
        if found is None:
            raise FileNotFoundError(f"{self.label}: {command[0]} left no file in {cache}")
        return found

    def _cached(self, cache: Path) -> Path | None:
        version = self.version.split(":")[-1]  # apt names files without the epoch
        patterns = {
            "deb": f"{self.name}_*{version}_*.deb",
            "npm": f"{self.name.replace('@', '').replace('/', '-')}-{version}.tgz",
            "pypi": f"{self.name}-{version}.tar.gz",
        }
        return next(iter(sorted(cache.glob(patterns[self.kind]))), None)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def members(path: Path) -> Iterator[tuple[str, bytes]]:
    """(path inside the package, contents) of every regular file, in archive order."""
    data = path.read_bytes()
    if data.startswith(AR_MAGIC):
        yield from _tar_files(_deb_data(data))
    else:
        yield from _tar_files(data)


def _deb_data(data: bytes) -> bytes:
    """The ``data.tar.*`` member of a .deb (ar) archive."""
    at = len(AR_MAGIC)
    while at + AR_HEADER <= len(data):
        header = data[at : at + AR_HEADER]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode())
        start = at + AR_HEADER
        if name.startswith("data.tar"):
            return data[start : start + size]
        at = start + size + (size % 2)  # members are aligned to even offsets
    raise ValueError("no data.tar member: not a Debian package")


def _tar_files(data: bytes) -> Iterator[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for info in archive:
            if info.isfile():
                handle = archive.extractfile(info)
                assert handle is not None  # a regular file always has contents
                yield info.name.removeprefix("./"), handle.read()
