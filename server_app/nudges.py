"""Getting a reply out of a SuperNode that holds it back.

Flower 1.42's SuperNode takes one message at a time: it pulls a message, waits until *some*
reply is in its state, sends every reply there, and pulls the next. A reply that comes after
its message was given up (an old run's task finishing after a ServerApp restart, found by
the fault soak) is therefore sent in place of the next message's, and that message's own
reply waits in the node until the one after it arrives. The node stays one reply behind
for good, and every round waits out ``round-timeout-s`` for it.

Any message to such a node makes it send what it holds, so a node that stays silent long
after the others answered is *nudged* with a query (cheap: it only names the node's
sources). A node whose reply came only after a nudge is behind; from then on it is nudged
right after each message, so its real reply goes out at once. Discovery marks nodes behind
the same way (:attr:`dept_strategy.discovery.SourceDirectory.behind`).

A nudge whose own quick reply overtook the message's (a ClientApp forked warm answers a
query in a fraction of a second, a training takes longer) released nothing: the training's
reply is held until the next nudge. So a node known behind is nudged again while it stays
silent, first after :data:`BEHIND_FIRST_S` and then after twice as long each time, up to
``after_s``: its reply waits at most about as long as its training took, for a handful of
queries a round. Any other silent node is nudged again each ``after_s``.
"""

from __future__ import annotations

import logging
import time

from flwr.serverapp import Grid

from dept_strategy.queries import discovery_queries

log = logging.getLogger(__name__)
NUDGE_AFTER_S = 60.0  # the least silence before a node is nudged
SLOWER_THAN_LAST = 2.0  # ... and it must be this many times the wait for the last reply
BEHIND_FIRST_S = 1.0  # a node known behind is nudged again this soon, then ever later


class NodesBehind:
    """Which nodes are behind, and the nudges of one exchange of messages."""

    def __init__(self, run_id: str, behind: set[int], after_s: float = NUDGE_AFTER_S) -> None:
        """``behind``: shared with discovery, so a node either finds behind is nudged."""
        self.run_id, self.behind, self.after_s = run_id, behind, after_s
        self.nudged: dict[int, float] = {}  # node -> when it was last nudged, this exchange
        self.times: dict[int, int] = {}  # node -> how often it was nudged, this exchange
        self.started = self.last_reply = time.monotonic()

    def pushed(self, grid: Grid, nodes: set[int]) -> None:
        """An exchange began with messages to ``nodes``: those behind are nudged now."""
        self.nudged, self.times, self.started = {}, {}, time.monotonic()
        self.last_reply = self.started
        self._nudge(grid, nodes & self.behind)

    def replied(self, node: int) -> None:
        """A reply came from ``node``; after a nudge, it is behind from now on."""
        self.last_reply = time.monotonic()
        if node in self.nudged and node not in self.behind:
            log.warning(
                "node %d sent its reply only when nudged: Flower's SuperNode holds one reply "
                "back there, so it is nudged after each message from now on",
                node,
            )
            self.behind.add(node)

    def waiting(self, grid: Grid, silent: set[int], any_reply: bool) -> None:
        """Nudge the ``silent`` nodes once the wait is long enough (at least ``after_s`` and
        twice the wait for the last reply if any came, else twice ``after_s``), and again
        each ``after_s`` while they stay silent; nodes known behind sooner (module doc)."""
        now = time.monotonic()
        waited = now - self.started
        due = {
            n for n in silent & self.behind if now - self.nudged.get(n, -1e9) >= self._again_s(n)
        }
        if any_reply:
            needed = max(self.after_s, SLOWER_THAN_LAST * (self.last_reply - self.started))
        else:
            needed = SLOWER_THAN_LAST * self.after_s
        if waited >= needed:
            due |= {n for n in silent if now - self.nudged.get(n, -1e9) >= self.after_s}
        if due - self.behind:
            log.info("nudging silent node(s) %s after %.0f s", sorted(due), waited)
        if due & self.behind:
            log.debug("nudging node(s) known behind %s again after %.0f s", sorted(due), waited)
        self._nudge(grid, due)

    def _again_s(self, node: int) -> float:
        """How long a node known behind stays silent after its last nudge before the next."""
        return min(self.after_s, BEHIND_FIRST_S * 2 ** (self.times.get(node, 1) - 1))

    def _nudge(self, grid: Grid, nodes: set[int]) -> None:
        if not nodes:
            return
        nudges = discovery_queries(sorted(nodes), self.run_id)
        self.nudged |= dict.fromkeys(nodes, time.monotonic())
        self.times |= {n: self.times.get(n, 0) + 1 for n in nodes}
        try:  # their replies are never pulled: they expire in the SuperLink
            grid.push_messages(nudges)
        except Exception as exc:  # a nudge only speeds a reply up: it must not end a round
            log.warning("could not nudge node(s) %s: %s", sorted(nodes), exc)
