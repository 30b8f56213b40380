"""The deployment the door tests share, one per test module (:mod:`tests.deploy.doors`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.doors import Doors, open_doors


@pytest.fixture(scope="module")
def doors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    with open_doors(tmp_path_factory.mktemp("doors")) as opened:
        yield opened
