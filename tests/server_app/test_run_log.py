"""dept run relays flwr run's output whole, less Flower's advice on a size it already set."""

from __future__ import annotations

import io
from pathlib import Path

import flwr.simulation.app

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


def test_only_the_misleading_notices_are_dropped() -> None:
    out = io.StringIO()
    relay(io.StringIO(STREAM), out)
    assert out.getvalue().splitlines() == [
        "\x1b[92mINFO \x1b[0m:      Starting Flower Simulation",
        "\x1b[92mINFO \x1b[0m:      Federation `@none/default` (4 simulated SuperNodes)",
        "\x1b[92mINFO \x1b[0m:      round 1/2 done",
    ]


def test_flower_still_prints_these_words() -> None:
    """A Flower release that rewords a notice would let it through: this says so."""
    source = Path(flwr.simulation.app.__file__).read_text()
    for notice in FLOWER_NOTICES:
        assert notice.strip() in source, notice
