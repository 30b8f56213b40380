"""The soak's check sees what a fault can silently cost: a run that lost its source's AdamW
moments, or skipped a stretch of its data, does not equal its twin, while an honest run
does, every time (in process, the soak's config)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.soak import checks
from benchmarks.soak.effect_sizes import LOSSES, with_loss
from benchmarks.soak.reference import node_configs
from client_app.app import app as client_app
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.deploy.loopback import DEBUG_TRAINING
from tests.helpers import share_cache

SOURCES = ("latin", "greek")
CONFIG = {  # as the soak trains
    **DEBUG_TRAINING,
    "num-server-rounds": 4,
    "fraction-evaluate": 0.0,
    "wait-for-nodes-s": 10.0,
    "round-timeout-s": 30.0,
}


def _run(folder: Path, cache: Path) -> Path:
    config = {**CONFIG, "output-dir": str(folder / "run")}
    nodes = node_configs(SOURCES, folder / "state")
    for node in nodes:
        share_cache(Path(node["state-dir"]), cache)
    run_federation(LocalGrid(client_app, nodes, config), config)
    return folder / "run"


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory, node_cache: Path) -> Path:
    return _run(tmp_path_factory.mktemp("twin"), node_cache)


@pytest.mark.parametrize(
    ("loss", "caught"), [(None, False), ("no-moments", True), ("skip-data", True)]
)
def test_a_loss_no_record_explains_breaks_the_check_and_an_honest_run_does_not(
    tmp_path: Path, node_cache: Path, twin: Path, loss: str | None, caught: bool
) -> None:
    # Prepare: latin's node, restarted before round 3, goes on without what ``loss`` takes
    undo = with_loss(LOSSES[loss], "latin", 3, stretch=64) if loss else (lambda: None)
    # Execute
    try:
        run = _run(tmp_path, node_cache)
    finally:
        undo()
    figures, broken = checks.compare(run, twin)
    # Assert
    assert bool(broken) is caught, (figures, broken)
    if caught:  # and how little it moves the figure a tolerance would have judged
        assert abs(figures["relative_bpb_gap"]) < 0.01
