"""metrics.jsonl holds whole lines: a failed append leaves the file as it was, and a reader
meeting a torn last line says so and reads the whole ones."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest

from dept.state import jsonl
from dept.state.jsonl import append_line, read_lines


def test_lines_are_appended_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append_line(path, json.dumps({"round": 0}))
    append_line(path, json.dumps({"round": 1}))
    assert read_lines(path) == [{"round": 0}, {"round": 1}]


def test_a_write_the_disk_cuts_short_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "metrics.jsonl"
    append_line(path, json.dumps({"round": 0}))
    before = path.read_bytes()
    real_write = os.write

    def full(descriptor: int, data: bytes) -> int:  # what fits, then the disk is full
        if len(data) > 4:
            return real_write(descriptor, data[:4])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jsonl.os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        append_line(path, json.dumps({"round": 1, "sources": {"a": 1.0}}))
    assert path.read_bytes() == before


def test_a_torn_last_line_is_said_and_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 0}\n{"round": 1}\n{"round": 2, "sour')
    with caplog.at_level(logging.WARNING):
        assert read_lines(path) == [{"round": 0}, {"round": 1}]
    assert "ends with a torn line" in caplog.text and "up to line 2" in caplog.text


def test_a_torn_line_inside_is_damage_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 0}\n{"rou\n{"round": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not JSON"):
        read_lines(path)
