"""benchmarks.overhead.quickstart reads each training round's wall time and speed from a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.overhead.quickstart import first_round_line_s, rounds


def test_each_training_round_gets_its_own_wall_time_and_median_speed(tmp_path: Path) -> None:
    def line(r: int, wall_s: float, speeds: list[float | None]) -> str:
        sources = {f"s{i}": {"tokens_per_s": v} for i, v in enumerate(speeds)}
        return json.dumps({"round": r, "wall_s": wall_s, "sources": sources})

    metrics = tmp_path / "metrics.jsonl"
    lines = [line(0, 3.0, [None, None]), line(1, 10.0, [100.0, 300.0]), line(2, 16.0, [200.0])]
    metrics.write_text("\n".join(lines) + "\n")

    assert rounds(metrics) == [
        {"round": 1, "wall_s": 7.0, "tokens_per_s": 200.0},
        {"round": 2, "wall_s": 6.0, "tokens_per_s": 200.0},
    ]


def test_the_first_round_line_is_read_as_the_run_printed_it(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(
        "18:11:22 dept run: 4 SuperNodes, 2 training at a time\n"
        "18:11:41 \x1b[92mINFO \x1b[0m:      round 0/3 done: avg val bpb 2.0370 over 4 source(s) "
        "[python-stdlib 3.223, synth-latin 2.342]; 19 s elapsed, ETA –\n"
        "18:11:48 INFO :      round 1/3 done: avg val bpb 1.3982 over 4 source(s); 26 s elapsed\n"
    )

    assert first_round_line_s(log) == 19
    log.write_text("18:11:22 dept run: 4 SuperNodes\n")
    with pytest.raises(RuntimeError, match="has no round 0 line"):
        first_round_line_s(log)
