"""A run with central DP, through the real ServerApp and ClientApp in process: ε each round
in metrics.jsonl, the final one in summary.json, every source still trained."""

import json
from pathlib import Path

import pytest

from dept_cli.in_process import federate_in_process
from dept_strategy.privacy import CentralPrivacy
from tests.helpers import debug_run_config, synthetic_sources


@pytest.mark.slow  # a federation of three sources, 9 s on two cores
def test_a_private_run_reports_its_epsilon_every_round(tmp_path: Path, node_cache: Path) -> None:
    sources = synthetic_sources(tmp_path, "latin", "greek", "cyrillic")
    # GLOB's φ rows each averaged over the sources that saw them would not be private
    dp = {
        "dp-noise-multiplier": 2.0,
        "dp-clip-norm": 0.5,
        "dp-delta": 1e-6,
        "embedding-rows": "all",
    }
    config = debug_run_config(
        tmp_path, node_cache, **{"sources-file": str(sources), "local-steps": 2, **dp}
    )

    out = federate_in_process(config)

    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    privacy = CentralPrivacy(2.0, 0.5, 1e-6)
    trained = [line for line in lines if line["round"] > 0]
    assert [line["privacy"]["epsilon"] for line in trained] == [
        privacy.epsilon(1),
        privacy.epsilon(2),
    ]
    assert all(line["privacy"]["sampled"] == 3 for line in trained)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["privacy"] == trained[-1]["privacy"]
    assert summary["problems"] == []
    assert all(s["tokens_trained"] > 0 for s in summary["sources"].values())
