"""What of ``flwr run``'s output reaches the user: all of it, each line stamped with the time
it arrived, less Flower's notices that are wrong for a ``dept run``.

Every ``flwr-simulation`` prints, before it loads any app code, that the default federation
size changed and how to change it (``flwr/simulation/app.py``); ``dept run`` sizes the
federation itself, so the advice only misleads. Those exact lines are the only ones dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO

from server_app.launch_clock import stamped

FLOWER_NOTICES = (
    "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",
    "To change federation size, use the following command:",
    "flwr federation simulation-config ",
)


def relay(lines: Iterable[str], out: IO[str]) -> None:
    """Copy ``lines`` to ``out`` as they come, each stamped with the time, less
    :data:`FLOWER_NOTICES`."""
    for line in lines:
        if not any(notice in line for notice in FLOWER_NOTICES):
            out.write(stamped(line))
            out.flush()
