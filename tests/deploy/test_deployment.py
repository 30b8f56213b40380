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


def test_three_nodes_train_and_a_broken_one_is_named(loopback: Loopback, tmp_path: Path) -> None:
    """A source joining mid-run, deployed with TLS and node keys, is docker/loopback.sh's
    test (test_loopback_script.py)."""
    state, out = tmp_path / "state", tmp_path / "out"
    loopback.start_superlink()
    start_nodes(loopback, state, SOURCES)
    loopback.add_node("broken", node_config("broken", state, path=str(tmp_path / "missing")))
    run = loopback.run(run_config(out, **{"num-server-rounds": 2, "min-available-nodes": 4}))

    wait_for_line(run, SERVER_DONE, RUN_S)
    summary = finish(loopback, run.text(), out)

    log = run.text()
    assert "cannot take part" in log and "broken" in log, log[-3000:]
    assert set(summary["sources"]) == set(SOURCES), log[-3000:]
    assert all(s["tokens_trained"] > 0 for s in summary["sources"].values())


def test_the_server_gives_up_waiting_for_nodes_and_says_so(loopback: Loopback) -> None:
    loopback.start_superlink()
    run = loopback.run(run_config(loopback.root / "out", **{"wait-for-nodes-s": 4.0}))
    line = wait_for_line(run, r"waited 4 s [^\n]*saw 0 node\(s\)", 120)
    assert "min-available-nodes" in line.string[line.start() : line.start() + 400]
