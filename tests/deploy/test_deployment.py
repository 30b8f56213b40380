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


def test_a_node_killed_mid_round_comes_back_with_its_embeddings(
    loopback: Loopback, tmp_path: Path
) -> None:
    state, out = tmp_path / "state", tmp_path / "out"
    loopback.start_superlink()
    # The victim's steps wait 0.3 s (its own step-delay-s): its rounds train 12 s, so the
    # kill lands while it trains, not after it has saved round 2 (150 undelayed steps could).
    slowed = f"{node_config(SOURCES[0], state)} step-delay-s=0.3"
    victim = loopback.add_node(SOURCES[0], slowed)
    start_nodes(loopback, state, SOURCES[1:])
    # The SuperLink answers for a node that misses two heartbeats (about 60 s); the round
    # timeout is only the backstop.
    config = {"num-server-rounds": 4, "local-steps": 40, "round-timeout-s": 300.0}
    config["min-available-nodes"] = 3
    config["download-compression"] = "int4"  # and the node that missed a round gets θ whole
    run = loopback.run(run_config(out, **config))

    wait_for_line(victim.superexec, rf"round 2 {victim.source}: step", RUN_S)
    victim.kill()
    # Back at once with the same state directory (a new node id): while round 2 waits for
    # the lost reply, it connects, and is asked which source it serves in time for round 3.
    back = loopback.add_node(victim.source, node_config(victim.source, state))
    wait_for_line(run, SERVER_DONE, 2 * RUN_S)
    summary = finish(loopback, run.text(), out)

    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert not rounds[2]["sources"].get(victim.source, {}).get("tokens"), rounds[2]
    assert victim.source in {f["source"] for f in rounds[2]["failed"]}, rounds[2]
    assert rounds[2]["sources"]["greek"]["tokens"] > 0, "the round went on without it"
    assert rounds[3]["sources"][victim.source]["tokens"] > 0, rounds[3]
    # round 4 sends every node the change; round 3 sent the one back from the dead the body
    assert rounds[3]["bytes_down"] > 2 * rounds[4]["bytes_down"], [r["bytes_down"] for r in rounds]
    reloaded = wait_for_line(back.superexec, r"embeddings from the state of round (\d+)", 10)
    assert int(reloaded.group(1)) == 1, "it reloaded what it saved after round 1"
    assert "embeddings fresh" not in back.log()
    assert set(summary["sources"]) == set(SOURCES)


def test_the_server_gives_up_waiting_for_nodes_and_says_so(loopback: Loopback) -> None:
    loopback.start_superlink()
    run = loopback.run(run_config(loopback.root / "out", **{"wait-for-nodes-s": 4.0}))
    line = wait_for_line(run, r"waited 4 s [^\n]*saw 0 node\(s\)", 120)
    assert "min-available-nodes" in line.string[line.start() : line.start() + 400]
