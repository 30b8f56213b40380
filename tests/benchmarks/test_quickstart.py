"""benchmarks.overhead.quickstart reads each training round's wall time and speed from a run."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.overhead.quickstart import rounds


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
