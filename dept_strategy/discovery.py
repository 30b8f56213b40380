"""Which node serves which source: asked of every new node with a ``query`` message.

DEPT samples *sources* each round (Algorithm 1), while Flower addresses *nodes*. Every node
that connects is asked once which sources it serves (a deployed SuperNode: the one in its
node config; a simulated one: its share of the run's sources), so the strategy can sample
sources, address the right node, and pick up nodes that join a running federation. A node
that fails to answer (bad node config, unreadable data) is logged with its reason and asked
again the next round (once per round, so a broken node does not flood the log).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from dept_strategy import keys
from dept_strategy.inflight import InFlight, Target
from dept_strategy.validation import last_line

log = logging.getLogger(__name__)
FAIL_FAST_GRACE_S = 10.0  # how long the node set must stay unchanged before giving up early


class NotEnoughNodes(RuntimeError):
    """Fewer nodes or sources than required within the configured wait."""


class SourceDirectory:
    """The node → sources map of a run, refreshed as nodes come and go."""

    def __init__(
        self, *, run_id: str, min_nodes: int, wait_s: float, query_timeout_s: float
    ) -> None:
        self.run_id = run_id
        self.min_nodes = max(1, min_nodes)
        self.wait_s = wait_s
        self.query_timeout_s = query_timeout_s
        self.node_sources: dict[int, list[str]] = {}
        self.asked_in_round: dict[int, int] = {}
        self.failures: dict[int, str] = {}  # node -> why it could not say what it serves

    def refresh(
        self, grid: Grid, server_round: int, on_failure: Callable[[int, str], None]
    ) -> dict[str, int]:
        """Ask nodes not yet known; return ``{source: node}`` for the connected nodes."""
        connected = set(grid.get_node_ids())
        unknown = sorted(
            n
            for n in connected - self.node_sources.keys()
            if self.asked_in_round.get(n) != server_round
        )
        self.asked_in_round.update(dict.fromkeys(unknown, server_round))
        if unknown:
            self._ask(grid, unknown, on_failure)
        owners: dict[str, int] = {}
        for node in sorted(connected & self.node_sources.keys()):
            for source in self.node_sources[node]:
                if source in owners:
                    log.warning(
                        "source %s is served by nodes %d and %d; using %d",
                        source,
                        owners[source],
                        node,
                        owners[source],
                    )
                    continue
                owners[source] = node
        return owners

    def _ask(self, grid: Grid, nodes: list[int], on_failure: Callable[[int, str], None]) -> None:
        config = ConfigRecord({keys.RUN_ID: self.run_id})
        in_flight = InFlight()  # credits a reply the SuperLink made (node gone) to its node
        messages = []
        for node in nodes:
            message = Message(
                RecordDict({keys.CONFIG: config}), dst_node_id=node, message_type=MessageType.QUERY
            )
            in_flight.track(message, Target(node, ""))
            messages.append(message)
        replies = list(grid.send_and_receive(messages, timeout=self.query_timeout_s))
        for reply in replies:
            target = in_flight.target_of(reply)
            self._learn(target.node if target else reply.metadata.src_node_id, reply, on_failure)
        for target in in_flight.unanswered(r.metadata.reply_to_message_id for r in replies):
            self.failures[target.node] = f"no answer within {self.query_timeout_s:.0f} s"
            on_failure(
                target.node, f"did not say which sources it serves: {self.failures[target.node]}"
            )

    def forget(self, node: int) -> None:
        """Ask ``node`` again next round (it failed: it may have restarted with other data)."""
        self.node_sources.pop(node, None)

    def _learn(self, node: int, reply: Message, on_failure: Callable[[int, str], None]) -> None:
        if reply.has_error():
            log.warning("node %d cannot take part: %s", node, reply.error.reason)
            self.failures[node] = last_line(reply.error.reason)
            on_failure(node, reply.error.reason or "?")
            return
        info = reply.content.config_records.get(keys.INFO)
        sources = info.get(keys.SOURCES) if info is not None else None
        if not isinstance(sources, list):
            self.failures[node] = f"query reply lacks '{keys.SOURCES}'"
            on_failure(node, self.failures[node])
            return
        self.failures.pop(node, None)
        self.node_sources[node] = [str(s) for s in sources]
        log.info("node %d serves %s", node, ", ".join(self.node_sources[node]) or "no source")

    def wait(
        self,
        grid: Grid,
        server_round: int,
        on_failure: Callable[[int, str], None],
        expected: frozenset[str] = frozenset(),
    ) -> dict[str, int]:
        """``refresh`` until ``min_nodes`` nodes and at least one source are there, or fail.

        With ``expected`` (a resumed run's sources) it waits, as long as ``wait_s`` allows,
        until all of them are served too, since sampling depends on which sources exist; if
        some never come it goes on with the others and says so.

        Fails early when every connected node has failed (or serves nothing) and no new
        node has connected for a short grace period: waiting longer would not help.
        """
        deadline = time.monotonic() + self.wait_s
        grace = min(self.wait_s, FAIL_FAST_GRACE_S)
        seen, stable_since, next_log = set[int](), time.monotonic(), 0.0
        while True:
            nodes = set(grid.get_node_ids())
            if nodes != seen:
                seen, stable_since = nodes, time.monotonic()
            enough = len(nodes) >= self.min_nodes
            owners = self.refresh(grid, server_round, on_failure) if enough else {}
            if owners and expected <= owners.keys():
                return owners
            idle = {n for n, served in self.node_sources.items() if not served}
            hopeless = enough and nodes <= self.failures.keys() | idle
            if hopeless and time.monotonic() - stable_since >= grace:
                raise NotEnoughNodes(f"no connected node can serve a source: {self._reasons()}")
            if time.monotonic() >= deadline and owners:
                log.warning(
                    "no node serves %s of the resumed run after %.0f s: going on without "
                    "them, so sampling differs from the uninterrupted run",
                    ", ".join(sorted(expected - owners.keys())),
                    self.wait_s,
                )
                return owners
            if time.monotonic() >= deadline:
                raise NotEnoughNodes(
                    f"waited {self.wait_s:.0f} s (config key 'wait-for-nodes-s') for "
                    f"{self.min_nodes} node(s) (config key 'min-available-nodes') serving at "
                    f"least one source, but saw {len(nodes)} node(s) serving "
                    f"{sum(map(len, self.node_sources.values()))} source(s). {self._reasons()}"
                )
            if time.monotonic() >= next_log:
                log.info("waiting for nodes: %d connected, %d required", len(nodes), self.min_nodes)
                next_log = time.monotonic() + 10
            time.sleep(0.5)

    def _reasons(self) -> str:
        return "; ".join(f"node {n}: {r}" for n, r in sorted(self.failures.items()))
