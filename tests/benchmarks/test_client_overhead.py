"""client_overhead runs and reports every arm against the bare loop."""

import json
from pathlib import Path

import pytest

from benchmarks.overhead.client_overhead import main, parse_args
from tests.helpers import corpus


def _run(tmp_path: Path, *extra: str) -> dict:
    corpus("en-shakespeare")
    out = tmp_path / "out"
    assert main(["--quick", "--out", str(out), "--work", str(tmp_path / "work"), *extra]) == 0
    return json.loads((out / "client_overhead.json").read_text())


@pytest.mark.slow
def test_in_process_against_bare_loop(tmp_path: Path) -> None:
    result = _run(tmp_path, "--no-flwr")

    assert set(result["arms"]) == {"bare", "in-process"}
    assert result["arms"]["bare"]["ratio_vs_bare"] == 1.0
    assert result["arms"]["in-process"]["message_tokens_per_s"] > 0
    assert result["first_message"]["tokens"] == 5 * 8 * 128
    assert {"load_avg_1_5_15", "torch_threads"} <= result["machine"].keys()
    assert len(result["runs"]) == 4  # 2 arms x 2 interleaved repeats


@pytest.mark.slow
def test_flwr_run_arm(tmp_path: Path) -> None:
    result = _run(tmp_path, "--repeats", "1", "--flwr-rounds", "1")

    assert result["arms"]["flwr-run"]["tokens_per_s"] > 0
    assert result["met"]["flwr-run"] in (True, False)


def test_an_option_given_beside_quick_holds() -> None:
    args = parse_args(["--quick", "--repeats", "1", "--flwr-rounds", "1"])

    assert (args.repeats, args.flwr_rounds) == (1, 1), "given, so kept"
    assert (args.model, args.local_steps) == ("debug", 5), "the quick defaults"
    assert parse_args([]).repeats == 3, "without --quick, the full run's"
