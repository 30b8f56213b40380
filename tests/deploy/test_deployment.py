"""The real deployment runtime on loopback: SuperLink, SuperNodes and their executors as
processes, ``flwr run`` against them. Slow (each test trains a few rounds of the ``debug``
preset across several processes) but bounded: every wait has a limit, and the fixture
kills every process it started, whatever the outcome. TLS, SuperNode authentication and the
gateway are in ``test_doors.py``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.loopback import (
    SERVER_DONE,
    Loopback,
    Node,
    node_config,
    run_config,
    wait_for_line,
)

pytestmark = pytest.mark.slow
SOURCES = ("latin", "cyrillic", "greek")
JOINER = "georgian"
RUN_S = 420  # upper bound for one short federation on a loaded 2-core machine


@pytest.fixture
def loopback(tmp_path: Path) -> Iterator[Loopback]:
    deployment = Loopback(tmp_path)
    try:
        yield deployment
    finally:
        deployment.close()


def start_nodes(deployment: Loopback, state: Path, sources: tuple[str, ...]) -> list[Node]:
    return [deployment.add_node(s, node_config(s, state)) for s in sources]


def finish(deployment: Loopback, run_log: str, out: Path) -> dict:
    summary = out / "summary.json"
    assert summary.exists(), deployment.logs_tail()
    return json.loads(summary.read_text())


def test_three_nodes_a_broken_one_and_a_source_joining_mid_run(
    loopback: Loopback, tmp_path: Path
) -> None:
    state, out = tmp_path / "state", tmp_path / "out"
    loopback.start_superlink()
    start_nodes(loopback, state, SOURCES)
    loopback.add_node("broken", node_config("broken", state, path=str(tmp_path / "missing")))
    run = loopback.run(run_config(out, **{"num-server-rounds": 4, "min-available-nodes": 4}))

    wait_for_line(run, r"round 1/4 done", RUN_S)
    joiner = loopback.add_node(JOINER, node_config(JOINER, state))
    joined = int(wait_for_line(run, rf"round (\d): training [^\n]*{JOINER}", RUN_S).group(1))
    wait_for_line(run, SERVER_DONE, RUN_S)
    summary = finish(loopback, run.text(), out)

    log = run.text()
    assert "cannot take part" in log and "broken" in log, log[-3000:]
    assert set(summary["sources"]) == {*SOURCES, JOINER}, log[-3000:]
    assert 2 <= joined <= 4
    assert summary["sources"][JOINER]["joined_round"] == joined
    assert summary["sources"][JOINER]["tokens_trained"] > 0
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r["round"] for r in rounds if r["sources"].get(JOINER, {}).get("tokens")]
    assert trained and trained[0] == joined, rounds
    assert "embeddings fresh" in joiner.log(), joiner.log()[-2000:]


def test_the_server_gives_up_waiting_for_nodes_and_says_so(loopback: Loopback) -> None:
    loopback.start_superlink()
    run = loopback.run(run_config(loopback.root / "out", **{"wait-for-nodes-s": 4.0}))
    line = wait_for_line(run, r"waited 4 s [^\n]*saw 0 node\(s\)", 120)
    assert "min-available-nodes" in line.string[line.start() : line.start() + 400]
