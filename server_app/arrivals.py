"""Replies handed over as they arrive, not all at once.

``Grid.send_and_receive`` returns a round's replies together, so a server aggregating N
pseudo-gradients would hold N bodies at once. Pulling in a loop, one message's reply per pull,
and yielding each as it comes lets the strategy add it to its running mean (or spool) and drop
it before the next is pulled: the server holds one reply, however many arrived within a poll.
The messages themselves are let go once pushed. Nodes that hold a reply back are nudged
(:mod:`server_app.nudges`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from flwr.app import Message
from flwr.serverapp import Grid

from server_app.nudges import NodesBehind

# Between pulls: a pull asks once per reply still missing, so a few missing replies are
# asked for often (a small federation's round waits for no poll) and many less often.
POLL_S = 1.0
QUICK_POLL_S = 0.25
PULLS_PER_S = 16


def poll_interval(waiting: int) -> float:
    """Seconds until the next pull with ``waiting`` replies missing: at most
    :data:`PULLS_PER_S` requests a second, between :data:`QUICK_POLL_S` and :data:`POLL_S`."""
    return min(POLL_S, max(QUICK_POLL_S, waiting / PULLS_PER_S))


def replies_as_they_arrive(
    grid: Grid,
    messages: Iterable[Message],
    timeout: float,
    poll_s: float | None = None,
    nudges: NodesBehind | None = None,
    follow_up: Callable[[Message], Message | None] | None = None,
) -> Iterator[Message]:
    """Push ``messages`` and yield their replies one by one until all are in or ``timeout``
    seconds have passed (the ones still missing are then reported by the strategy). A reply
    for which ``follow_up`` gives a message is not yielded: that message is pushed, and its
    reply awaited in its place (a node asking for the whole body, :mod:`dept.wire.download`).
    ``poll_s`` fixes the time between pulls (default: :func:`poll_interval`)."""
    messages = list(messages)
    nodes = [m.metadata.dst_node_id for m in messages]
    node_of = dict(zip(grid.push_messages(messages), nodes, strict=True))
    del messages
    waiting = set(node_of)
    if nudges is not None:
        nudges.pushed(grid, set(node_of.values()))
    deadline = time.monotonic() + timeout
    while waiting:
        for message_id in sorted(waiting):
            batch = list(grid.pull_messages([message_id]))  # one reply in memory at a time
            while batch:
                answered = batch[0].metadata.reply_to_message_id
                waiting.discard(answered)
                again = follow_up(batch[0]) if follow_up is not None else None
                if again is not None:
                    batch.pop(0)
                    node = again.metadata.dst_node_id
                    (sent,) = grid.push_messages([again])
                    node_of[sent], again = node, None
                    waiting.add(sent)
                    continue
                if nudges is not None:
                    nudges.replied(node_of[answered])
                yield batch.pop(0)  # nothing here holds it once handed over
        if not waiting or time.monotonic() >= deadline:
            return
        if nudges is not None:
            nudges.waiting(grid, {node_of[m] for m in waiting}, len(waiting) < len(node_of))
        time.sleep(poll_interval(len(waiting)) if poll_s is None else poll_s)
