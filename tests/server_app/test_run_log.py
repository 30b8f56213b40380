"""dept run relays flwr run's output whole, each line stamped with the time, less Flower's
advice on a size it already set; the rounds count from the command."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import flwr.simulation.app
import pytest

from server_app import launch_clock
from server_app.run_log import FLOWER_NOTICES, relay

# as flwr-simulation prints them through the log stream (colour codes included)
STREAM = (
    """\
\x1b[92mINFO \x1b[0m:      Starting Flower Simulation
\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.
\x1b[92mINFO \x1b[0m:      Federation `@none/default` (4 simulated SuperNodes)
\x1b[92mINFO \x1b[0m:      To change federation size, use the following command:
\x1b[92mINFO \x1b[0m:      \tflwr federation simulation-config @none/default <superlink> """
    """--num-supernodes <N>
\x1b[92mINFO \x1b[0m:      round 1/2 done
"""
)


def test_only_the_misleading_notices_are_dropped_and_every_line_is_stamped() -> None:
    out = io.StringIO()
    relay(io.StringIO(STREAM), out)
    lines = out.getvalue().splitlines()
    assert all(re.match(r"\d\d:\d\d:\d\d ", line) for line in lines), lines
    assert [line[9:] for line in lines] == [
        "\x1b[92mINFO \x1b[0m:      Starting Flower Simulation",
        "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (4 simulated SuperNodes)",
        "\x1b[92mINFO \x1b[0m:      round 1/2 done",
    ]


def test_elapsed_counts_from_the_dept_run_that_started_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(launch_clock.LAUNCHED_AT_VARIABLE, raising=False)
    assert launch_clock.since_launch() is None, "not started by dept run: the rounds' clock"
    started = launch_clock.process_started_at()
    assert time.time() - 3600 < started <= time.time(), "this process's start, before imports"
    monkeypatch.setenv(launch_clock.LAUNCHED_AT_VARIABLE, repr(time.time() - 44.0))
    assert launch_clock.since_launch() == pytest.approx(44.0, abs=1.0)


def test_flower_still_prints_these_words() -> None:
    """A Flower release that rewords a notice would let it through: this says so."""
    source = Path(flwr.simulation.app.__file__).read_text()
    for notice in FLOWER_NOTICES:
        assert notice.strip() in source, notice
