"""server_scaling measures aggregation in fresh processes, in bodies of memory."""

import json
import math
from pathlib import Path

from benchmarks.server_scaling import body_shapes, main


def test_body_shapes_come_close_to_the_size_asked() -> None:
    for size in (1e6, 1e7, 1e8):
        params = sum(math.prod(s) for s in body_shapes(size).values())
        assert 0.7 * size < params < 1.3 * size


def test_server_scaling_quick(tmp_path: Path) -> None:
    out = tmp_path / "out"

    argv = ["--sizes", "3e5", "--replies", "2", "--out", str(out), "--spool", str(tmp_path)]
    assert main(argv) == 0

    result = json.loads((out / "server_scaling.json").read_text())
    paths = {r["path"]: r for r in result["runs"]}
    assert set(paths) == {"streamed", "strategy"}
    assert paths["strategy"]["messages_x_body"] > 1.9  # both replies held at once
    assert paths["streamed"]["peak_x_body"] > 0 and paths["streamed"]["seconds"] > 0
    assert isinstance(result["met"], bool)
