"""Replies handed over as they arrive, not all at once.

``Grid.send_and_receive`` returns a round's replies together, so a server aggregating N
pseudo-gradients would hold N bodies at once. Pulling in a loop and yielding each reply as it
comes lets the strategy add it to its running mean and drop it: the server holds the replies
that arrived within one poll, not the round's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from flwr.app import Message
from flwr.serverapp import Grid

POLL_S = 1.0


def replies_as_they_arrive(
    grid: Grid, messages: Iterable[Message], timeout: float, poll_s: float = POLL_S
) -> Iterator[Message]:
    """Push ``messages`` and yield their replies one by one until all are in or ``timeout``
    seconds have passed (the ones still missing are then reported by the strategy)."""
    waiting = set(grid.push_messages(messages))
    deadline = time.monotonic() + timeout
    while waiting:
        batch = list(grid.pull_messages(waiting))
        waiting.difference_update(r.metadata.reply_to_message_id for r in batch)
        while batch:
            yield batch.pop(0)  # the batch lets go of each reply once it is handed over
        if not waiting or time.monotonic() >= deadline:
            return
        time.sleep(poll_s)
