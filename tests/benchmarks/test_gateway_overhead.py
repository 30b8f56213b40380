"""The gateway benchmark at its quick size, through real nginx and a real SuperLink."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.overhead import gateway_overhead
from tests.deploy import gateway


@pytest.mark.slow
@pytest.mark.skipif(gateway.nginx() is None, reason="nginx is not installed (nginx-light)")
def test_quick_run_measures_every_arm_and_the_reply(tmp_path: Path) -> None:
    assert gateway_overhead.main(["--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gateway-overhead.json").read_text())
    assert set(result["latency_ms"]) == {"direct", "gateway", "verifier"}
    assert all(len(v) == 30 for v in result["latency_ms"].values())
    assert set(result["reply"]["seconds"]) == {"direct", "gateway"}
    assert result["reply"]["bytes"] >= 100 * 2**20
    assert (tmp_path / "gateway-overhead.png").stat().st_size > 0
