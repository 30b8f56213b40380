"""server_scaling measures aggregation in fresh processes, in bodies of memory."""

import json
import math
from pathlib import Path

import pytest

from benchmarks.overhead.server_scaling import PAPER_BODIES, body_shapes, llama_body, main


def test_body_shapes_come_close_to_the_size_asked() -> None:
    for size in (1e6, 1e7, 1e8):
        params = sum(math.prod(s) for s in body_shapes(size).values())
        assert 0.7 * size < params < 1.3 * size


def test_the_paper_bodies_have_the_paper_sizes() -> None:
    params = {
        n: sum(math.prod(s) for s in llama_body(*d).values()) for n, d in PAPER_BODIES.items()
    }
    assert 2.8e8 < params["350m"] < 3.2e8
    assert 1.2e9 < params["1.3b"] < 1.4e9


@pytest.mark.slow
def test_server_scaling_quick(tmp_path: Path) -> None:
    out = tmp_path / "out"

    argv = ["--sizes", "3e5", "--replies", "3", "--out", str(out), "--spool", str(tmp_path)]
    # the mean, refolded from the spool (fast), or made from it at the end (lean)
    assert main([*argv, "--modes", "mean-clipped", "--server-memory", "fast,lean"]) == 0

    result = json.loads((out / "server_scaling.json").read_text())
    runs = {(r["path"], r["memory"]): r for r in result["runs"]}
    assert set(runs) == {(p, m) for p in ("streamed", "strategy") for m in ("fast", "lean")}
    assert runs["strategy", "fast"]["held_x_body"] > 2.9  # the replies held before the round
    assert runs["streamed", "fast"]["held_x_body"] == 0
    assert all(r["clipped"] == 1 and 0 < r["traced_x_body"] < 3 for r in runs.values())
    assert runs["streamed", "lean"]["traced_x_body"] < runs["streamed", "fast"]["traced_x_body"]
    assert isinstance(result["met"], bool) and len(result["resident_met"]) == 4
