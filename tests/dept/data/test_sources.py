"""The early data check a node runs before training, and the sources file's errors.

Each message must be one line naming source (or sources file), file and problem: the server
shows only the last line of a client's error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client_app.node import served_sources
from dept.config import ConfigError, load_config
from dept.data.sources import SourceSpec, check_source_paths, load_sources
from dept.data.text_checks import SNIFF_BYTES
from tests.helpers import debug_run_config

BAD_CONTENT = {
    "empty": (b"", "is empty"),
    "binary": (b"text\0\x01\x02", "looks binary (NUL bytes in its first 64 KiB)"),
    "latin-1": (b"a" * 1234 + b"\xff rest", "is not UTF-8 text (invalid byte 0xff at offset 1234)"),
    "cut character": (
        "caf\u00e9".encode()[:-1],
        "is not UTF-8 text (invalid byte 0xc3 at offset 3)",
    ),
    "blank": (b"\n\n   \n", "has no text (only whitespace)"),
}


def _folder(root: Path, train: bytes = b"some text\n", val: bytes = b"more text\n") -> Path:
    folder = root / "data"
    folder.mkdir(exist_ok=True)
    (folder / "train.txt").write_bytes(train)
    (folder / "val.txt").write_bytes(val)
    return folder


def _check_fails(spec: SourceSpec, file: Path, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_source_paths([spec])
    assert str(caught.value) == f"source {spec.name!r}: {file} {problem}"


@pytest.mark.parametrize("case", BAD_CONTENT)
def test_folder_sources_are_sniffed(tmp_path: Path, case: str) -> None:
    content, problem = BAD_CONTENT[case]
    folder = _folder(tmp_path, val=content)
    _check_fails(SourceSpec(name="de-novels", path=str(folder)), folder / "val.txt", problem)


@pytest.mark.parametrize("case", BAD_CONTENT)
def test_every_file_of_a_glob_is_sniffed(tmp_path: Path, case: str) -> None:
    content, problem = BAD_CONTENT[case]
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "fine"}) + "\n")
    (tmp_path / "b.jsonl").write_bytes(content)
    spec = SourceSpec(name="code", path=str(tmp_path / "*.jsonl"))
    _check_fails(spec, tmp_path / "b.jsonl", problem)


def test_a_character_cut_by_the_sniff_is_not_flagged(tmp_path: Path) -> None:
    euro = "\u20ac".encode()  # 3 bytes: the sniff ends inside the one starting 1 byte early
    head = b"a" * (SNIFF_BYTES - 1) + euro + b"tail\n"
    folder = _folder(tmp_path, train=head)
    check_source_paths([SourceSpec(name="x", path=str(folder))])


def test_the_sniff_reads_only_the_start(tmp_path: Path) -> None:
    """Invalid UTF-8 deeper in the file is left to the load (tests/dept/data/test_corpus.py)."""
    folder = _folder(tmp_path, train=b"a" * SNIFF_BYTES + b"\xff\n")
    check_source_paths([SourceSpec(name="x", path=str(folder))])


def test_binary_formats_are_only_checked_for_emptiness(tmp_path: Path) -> None:
    import datasets

    good = tmp_path / "good.parquet"
    datasets.Dataset.from_list([{"text": "a document"}]).to_parquet(str(good))
    check_source_paths([SourceSpec(name="p", path=str(good))])
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    _check_fails(SourceSpec(name="p", path=str(empty)), empty, "is empty")


def test_an_unreadable_match_is_named(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").mkdir()
    spec = SourceSpec(name="x", path=str(tmp_path / "*.jsonl"))
    _check_fails(spec, tmp_path / "x.jsonl", "cannot be read (Is a directory)")


def test_a_node_answers_with_the_bad_file(tmp_path: Path) -> None:
    """What a deployment node raises when asked which sources it serves."""
    cfg = load_config(debug_run_config(tmp_path))
    folder = _folder(tmp_path, train=b"")
    with pytest.raises(ConfigError) as caught:
        served_sources(cfg, {"source": "de-novels", "path": str(folder)})
    assert str(caught.value) == f"source 'de-novels': {folder / 'train.txt'} is empty"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (
            b"sources:\n  - name b\n    path: x\n",
            " is not valid YAML: mapping values are not allowed here at line 3, column 9",
        ),
        (
            b'sources: "abc\n',
            " is not valid YAML: found unexpected end of stream at line 2, column 1 "
            "(while scanning a quoted scalar at line 1, column 10)",
        ),
        (b"- name: caf\xe9\n", " is not UTF-8 text (invalid byte 0xe9 at offset 11)"),
        (
            b"hello world\n",
            ": expected a non-empty list of sources; it holds the str 'hello world'",
        ),
        (b"sources: []\n", ": expected a non-empty list of sources; its 'sources:' holds an empty"),
        (b"- 3\n", ": each source must be a mapping (entry 1 is the int 3)"),
        (
            b"- name: a\n  path: x\n  vocab-size: abc\n",
            ": source 'a' key 'vocab-size' is the string 'abc'; write it as a number",
        ),
        (
            b"- name: a\n  path: x\n  vocab_size: 512\n  tokenzier: y\n",
            ": source 'a': unknown key(s) tokenzier, vocab_size (did you mean vocab-size?); "
            "keys are kebab-case, one of: config, max-train-bytes, name, ",
        ),
    ],
)
def test_bad_sources_files_name_the_file(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_sources(path)
    message = str(caught.value)
    assert message.startswith(f"sources file {path}{problem}") and "\n" not in message


def test_an_unreadable_sources_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("- name: a\n  path: x\n")

    def denied(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ConfigError, match=f"^sources file {path} cannot be read"):
        load_sources(path)


def test_defaults_fill_only_the_keys_an_entry_omits(tmp_path: Path) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(
        "- {name: given, path: 'builtin:synthetic-latin', vocab-size: 512}\n"
        "- {name: omitted, path: 'builtin:synthetic-greek'}\n"
    )

    plain = {s.name: s.vocab_size for s in load_sources(path)}
    filled = {s.name: s.vocab_size for s in load_sources(path, defaults={"vocab-size": 4096})}

    assert plain == {"given": 512, "omitted": SourceSpec.vocab_size}, "dept run keeps 2048"
    assert filled == {"given": 512, "omitted": 4096}
