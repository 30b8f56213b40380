"""The real deployment runtime on loopback: SuperLink, SuperNodes and their executors as
processes, ``flwr run`` against them. Slow but bounded: every wait has a limit, and the
fixture kills every process it started, whatever the outcome. TLS, SuperNode authentication
and the gateway are in ``test_doors.py``; a federation with a joiner is docker/loopback.sh's
test (``test_loopback_script.py``); a node whose data is missing, named while the others
train, is the process federation's test (``tests/server_app/test_process_federation.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.loopback import Loopback, run_config, wait_for_line

pytestmark = pytest.mark.slow


@pytest.fixture
def loopback(tmp_path: Path) -> Iterator[Loopback]:
    deployment = Loopback(tmp_path)
    try:
        yield deployment
    finally:
        deployment.close()


def test_the_server_gives_up_waiting_for_nodes_and_says_so(loopback: Loopback) -> None:
    loopback.start_superlink()
    run = loopback.run(run_config(loopback.root / "out", **{"wait-for-nodes-s": 4.0}))
    line = wait_for_line(run, r"waited 4 s [^\n]*saw 0 node\(s\)", 120)
    assert "min-available-nodes" in line.string[line.start() : line.start() + 400]
