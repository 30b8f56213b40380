"""The English corpus builder, offline: packages made here stand in for the registries'; the
build reads them without unpacking, splits documents by hash, writes what its manifest
says, gives the same bytes twice and refuses a package that is not the pinned one."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from benchmarks.corpora import english, readers
from benchmarks.corpora.artefacts import Artefact, members, sha256

FORTUNES = "\n%\n".join(f"Saying number {n}.\n\t-- Someone {n}" for n in range(400)) + "\n"
PAGE = '.TH X 1\n.\\" a comment\n.SH NAME\nx \\- do \\fBthings\\fR\n.PP\nText.\n'


def _tar(files: dict[str, bytes], mode: str = "w:xz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _deb(path: Path, files: dict[str, bytes]) -> None:
    """A Debian package as dpkg-deb builds one: an ar archive ending in data.tar.xz."""
    parts = {"debian-binary": b"2.0\n", "control.tar.xz": _tar({}), "data.tar.xz": _tar(files)}
    out = bytearray(b"!<arch>\n")
    for name, data in parts.items():
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    path.write_bytes(bytes(out))


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    folder = tmp_path / "packages"
    folder.mkdir()
    _deb(
        folder / "fortunes_1.0-1_all.deb",
        {"./usr/share/games/fortunes/sayings": FORTUNES.encode(), "./usr/share/doc/x": b"no"},
    )
    _deb(
        folder / "pages_2.0_all.deb",
        {f"./usr/share/man/man1/p{n}.1.gz": gzip.compress(PAGE.encode() * 60) for n in range(40)},
    )
    (folder / "lib-3.0.0.tgz").write_bytes(
        _tar({"package/big.js": ("let x = 1;\n" * 9000).encode()}, "w:gz")
    )
    return folder


DOMAINS = {
    "en-quotes": [
        english.Read(
            Artefact("deb", "fortunes", "1:1.0-1"), r"usr/share/games/.*", readers.fortunes
        )
    ],
    "en-manpages": [
        english.Read(Artefact("deb", "pages", "2.0"), r".*\.gz", readers.manual_page),
        english.Read(Artefact("npm", "lib", "3.0.0"), r"package/.*\.js", readers.source_file),
    ],
}


def test_a_debian_package_is_read_without_dpkg(cache: Path) -> None:
    files = dict(members(cache / "fortunes_1.0-1_all.deb"))
    assert set(files) == {"usr/share/games/fortunes/sayings", "usr/share/doc/x"}
    assert files["usr/share/games/fortunes/sayings"] == FORTUNES.encode()


def test_a_manual_page_keeps_its_words_and_drops_its_requests() -> None:
    ((_, text),) = readers.manual_page("p.1", PAGE.encode(), {})
    assert text == "NAME\nx - do things\nText.\n"


def test_the_build_splits_by_hash_writes_its_manifest_and_gives_the_same_bytes_twice(
    tmp_path: Path, cache: Path
) -> None:
    first = english.build(tmp_path / "a", cache, DOMAINS, train_bytes=10_000)
    second = english.build(tmp_path / "b", cache, DOMAINS, train_bytes=10_000)

    assert first == second
    quotes = first["domains"]["en-quotes"]
    train = (tmp_path / "a" / "en-quotes" / "train.txt").read_bytes()
    val = (tmp_path / "a" / "en-quotes" / "val.txt").read_bytes()
    assert quotes["train.txt"] == {"bytes": len(train), "sha256": sha256(train)}
    assert 9_990 <= len(train) < 10_100 and val, "capped at a whole document; some held out"
    said = {s.strip() for s in train.decode().split("\n\n")}
    assert not said & {s.strip() for s in val.decode().split("\n\n")}, "no document in both"
    assert [f["path"] for f in quotes["files"]] == ["usr/share/games/fortunes/sayings"]
    assert quotes["packages"][0]["sha256"] == sha256(
        (cache / "fortunes_1.0-1_all.deb").read_bytes()
    )
    pages = first["domains"]["en-manpages"]
    assert len(pages["files"]) == 41, "every file read is listed with its hash"
    written = json.loads((tmp_path / "a" / english.MANIFEST).read_text())
    assert written == json.loads(json.dumps(first))
    assert "en-manpages" in (tmp_path / "a" / "sources.yaml").read_text()
    ood = (tmp_path / "a" / "sources-ood.yaml").read_text()
    held = (tmp_path / "a" / "held-out.yaml").read_text()
    name = f'"name": "{english.OOD_DOMAIN}"'
    assert '"name": "en-manpages"' in ood and name not in ood, "the OOD runs' sources"
    assert name in held and '"name": "en-manpages"' not in held


def test_long_documents_are_cut_at_line_ends() -> None:
    parts = list(english._parts("big", "line\n" * 20_000))
    assert len(parts) == 4 and parts[1][0] == "big#part1"
    assert "".join(t for _, t in parts) == "line\n" * 20_000
    assert all(len(t) <= english.CHUNK_CHARS for _, t in parts)


def test_a_package_that_is_not_the_pinned_one_stops_the_build(tmp_path: Path, cache: Path) -> None:
    pins = english.build(tmp_path / "a", cache, DOMAINS, train_bytes=10_000)
    assert english.build(tmp_path / "b", cache, DOMAINS, 10_000, pins=pins) == pins

    _deb(cache / "fortunes_1.0-1_all.deb", {"./usr/share/games/fortunes/sayings": b"other\n"})

    with pytest.raises(
        ValueError, match=r"en-quotes: deb:fortunes=1:1.0-1 has SHA-256 \w+, the manifest pins"
    ):
        english.build(tmp_path / "c", cache, DOMAINS, 10_000, pins=pins)


def test_the_committed_manifest_pins_every_domain_with_a_megabyte_of_training_text() -> None:
    pins = json.loads(
        (english.Path(english.__file__).with_name("english-manifest.json")).read_text()
    )
    assert set(pins["domains"]) == set(english.DOMAINS) and len(pins["domains"]) >= 6
    for name, record in pins["domains"].items():
        assert record["train.txt"]["bytes"] >= 1_000_000, name
        assert record["val.txt"]["bytes"] >= 100_000, name
        assert all(len(f["sha256"]) == 64 for f in record["files"]), name
