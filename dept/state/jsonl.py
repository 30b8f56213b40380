"""JSON Lines files that hold whole lines only: a run's ``metrics.jsonl``.

A line is appended with one ``write`` on a file opened for appending; if the write fails
part way (a full disk writes what fits, then raises), the file is cut back to where it was,
so what is there is always whole lines. A reader that still meets a torn last line (a file
written by an older version, or a machine that lost power mid-write) says so and reads up to
the last whole line; a torn line anywhere else is damage, and an error naming the file.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def append_line(path: Path, line: str) -> None:
    """Append ``line`` (one line of text, without its newline) and a newline to ``path``,
    whole or not at all."""
    data = (line + "\n").encode()
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(descriptor).st_size
        try:
            written = 0
            while written < len(data):
                written += os.write(descriptor, data[written:])
        except OSError:
            os.ftruncate(descriptor, start)
            raise
    finally:
        os.close(descriptor)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every whole line of ``path`` as a JSON object; a torn last line is left out and said
    (a :class:`ValueError` naming the file and line for one torn anywhere else)."""
    text = path.read_text()
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines) and not text.endswith("\n"):
                log.warning(
                    "%s ends with a torn line (%d bytes, no newline): read up to line %d, "
                    "the last whole one",
                    path,
                    len(line.encode()),
                    number - 1,
                )
                break
            raise ValueError(f"{path}: line {number} is not JSON ({exc.msg})") from exc
    return records
