import time

import pytest

from dept_strategy.discovery import NotEnoughNodes, SourceDirectory
from server_app.local_grid import LocalGrid
from tests.helpers import directory_app


class ArrivingGrid(LocalGrid):
    """Node 2 connects ``delay`` seconds after the first look."""

    def __init__(self, app, delay: float) -> None:
        super().__init__(app, [{}, {}], {})
        self.delay, self.first_look = delay, None

    def get_node_ids(self):
        self.first_look = self.first_look or time.monotonic()
        return [1, 2] if time.monotonic() - self.first_look >= self.delay else [1]


def _directory(wait_s: float) -> SourceDirectory:
    return SourceDirectory(run_id="r", min_nodes=0, wait_s=wait_s, query_timeout_s=5)


def test_a_bad_first_node_does_not_end_the_wait_for_a_good_one() -> None:
    grid = ArrivingGrid(directory_app({2: ["de"]}), delay=1.5)
    failures: list[tuple[int, str]] = []
    owners = _directory(wait_s=30).wait(grid, 0, lambda n, r: failures.append((n, r)))
    assert owners == {"de": 2} and failures[0][0] == 1


def test_gives_up_early_with_every_reason_when_no_node_can_serve() -> None:
    grid = LocalGrid(directory_app({2: []}), [{}, {}], {})
    started = time.monotonic()
    with pytest.raises(
        NotEnoughNodes, match=r"no connected node can serve a source: node 1: .*no data"
    ):
        _directory(wait_s=2).wait(grid, 0, lambda n, r: None)
    assert time.monotonic() - started < 10


def test_a_forgotten_node_is_asked_again_next_round() -> None:
    served = {1: ["de"]}
    grid = LocalGrid(directory_app(served), [{}], {})
    directory = _directory(wait_s=2)
    assert directory.refresh(grid, 1, lambda n, r: None) == {"de": 1}
    served[1] = ["fr"]  # the node restarted with other data
    assert directory.refresh(grid, 2, lambda n, r: None) == {"de": 1}, "known nodes are not asked"
    directory.forget(1)
    assert directory.refresh(grid, 2, lambda n, r: None) == {"fr": 1}
