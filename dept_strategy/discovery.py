"""Which node serves which source: asked of every new node with a ``query`` message.

DEPT samples *sources* each round (Algorithm 1), while Flower addresses *nodes*. Every node
that connects is asked once which sources it serves (a deployed SuperNode: the one in its
node config; a simulated one: its share of the run's sources), so the strategy can sample
sources, address the right node, and pick up nodes that join a running federation. A node
that fails to answer (bad node config, unreadable data) is logged with its reason and asked
again the next round (once per round, so a broken node does not flood the log).

A source has one node at a time: the first that served it keeps it while it is connected,
and a second node claiming it is refused (both ids logged, the conflict recorded) instead of
taking its place. Where nodes authenticate, a source can be pinned to a node key
(:mod:`dept_strategy.identity`): only a node with that key may serve it, so a stranger's
node cannot take over a source whose own node is down.
"""

from __future__ import annotations

import logging
import time

from flwr.app import ConfigRecord, Message
from flwr.serverapp import Grid

from dept import keys
from dept_strategy.history import RunHistory
from dept_strategy.identity import fingerprint, node_keys
from dept_strategy.inflight import Target
from dept_strategy.queries import send_queries
from dept_strategy.validation import last_line

log = logging.getLogger(__name__)
FAIL_FAST_GRACE_S = 10.0  # how long the node set must stay unchanged before giving up early


def _same_key(keys_of: dict[int, bytes], a: int, b: int) -> bool:
    """Both nodes authenticated with one key: the same node, restarted under a new id."""
    return bool(keys_of.get(a)) and keys_of.get(a) == keys_of.get(b)


class NotEnoughNodes(RuntimeError):
    """Fewer nodes or sources than required within the configured wait."""


class SourceDirectory:
    """The node → sources map of a run, refreshed as nodes come and go."""

    def __init__(
        self,
        *,
        run_id: str,
        min_nodes: int,
        wait_s: float,
        query_timeout_s: float,
        pinned: dict[str, bytes] | None = None,
    ) -> None:
        """``pinned``: source → the DER public key its node must authenticate with."""
        self.run_id = run_id
        self.min_nodes = max(1, min_nodes)
        self.wait_s = wait_s
        self.query_timeout_s = query_timeout_s
        self.pinned = pinned or {}
        self.node_sources: dict[int, list[str]] = {}  # in the order nodes first answered
        self.asked_in_round: dict[int, int] = {}
        self.failures: dict[int, str] = {}  # node -> why it could not say what it serves
        self.owner: dict[str, int] = {}  # source -> the node serving it
        self.refused: set[tuple[str, int]] = set()  # (source, node) conflicts already reported
        self.conflicts: list[dict[str, str]] = []  # what was refused, for the run's report

    def refresh(self, grid: Grid, server_round: int, history: RunHistory) -> dict[str, int]:
        """Ask nodes not yet known (a node that cannot answer goes into ``history``); return
        ``{source: node}`` for the connected nodes."""
        connected = set(grid.get_node_ids())
        unknown = sorted(
            n
            for n in connected - self.node_sources.keys()
            if self.asked_in_round.get(n) != server_round
        )
        self.asked_in_round.update(dict.fromkeys(unknown, server_round))
        if unknown:
            self._ask(grid, unknown, server_round, history)
        keys_of = node_keys(grid)  # empty where nodes do not authenticate
        for node in [n for n in self.node_sources if n in connected]:  # first answered first
            for source in self.node_sources[node]:
                self._claim(server_round, source, node, connected, keys_of)
        return {
            s: n
            for s, n in self.owner.items()
            if n in connected and s in self.node_sources.get(n, ())
        }

    def _claim(
        self,
        server_round: int,
        source: str,
        node: int,
        connected: set[int],
        keys_of: dict[int, bytes],
    ) -> None:
        """Give ``source`` to ``node`` unless a connected node serves it or a pin forbids;
        a node with the key of the connected holder, which answered after it, is that node
        restarted under a new id and takes the source over."""
        holder = self.owner.get(source)
        if holder == node:
            return
        if source in self.pinned and keys_of.get(node) != self.pinned[source]:
            key = keys_of.get(node)
            why = (
                f"its key ({fingerprint(key) if key else 'none: the node did not authenticate'})"
                f" is not the key {source} is pinned to ({fingerprint(self.pinned[source])})"
            )
            self._refuse(server_round, source, node, holder, why)
            return
        if holder is not None and holder in connected:
            if not _same_key(keys_of, holder, node):
                self._refuse(server_round, source, node, holder, f"node {holder} serves it already")
                return
            if self._answered_before(node, holder):
                return  # the older id of a restarted node: the newer keeps the source
        if holder is not None:
            why = "gone" if holder not in connected else "restarted: the same key"
            log.info("source %s moves from node %d (%s) to node %d", source, holder, why, node)
        self.owner[source] = node

    def _answered_before(self, node: int, other: int) -> bool:
        order = list(self.node_sources)
        return other in order and order.index(node) < order.index(other)

    def _refuse(
        self, server_round: int, source: str, node: int, holder: int | None, why: str
    ) -> None:
        if (source, node) in self.refused:
            return
        self.refused.add((source, node))
        log.warning(
            "round %d: node %d claims source %s; refused: %s", server_round, node, source, why
        )
        self.conflicts.append(
            {
                "round": str(server_round),
                "source": source,
                "refused_node": str(node),
                "kept_node": str(holder) if holder is not None else "",
                "reason": why,
            }
        )

    def _ask(self, grid: Grid, nodes: list[int], server_round: int, history: RunHistory) -> None:
        config = ConfigRecord({keys.RUN_ID: self.run_id})
        queries = [(Target(node, ""), config) for node in nodes]
        replies, silent = send_queries(grid, queries, self.query_timeout_s)
        for target, reply in replies:
            node = target.node if target else reply.metadata.src_node_id
            self._learn(node, reply, server_round, history)
        for target in silent:
            self.failures[target.node] = f"no answer within {self.query_timeout_s:.0f} s"
            why = f"did not say which sources it serves: {self.failures[target.node]}"
            log.warning("node %d %s", target.node, why)
            history.failed(server_round, target.node, why)

    def forget(self, node: int) -> None:
        """Ask ``node`` again next round (it failed: it may have restarted with other data).
        It keeps its sources meanwhile, so no other node takes them over; what it no longer
        serves when it answers again is let go then."""
        self.node_sources.pop(node, None)

    def _learn(self, node: int, reply: Message, server_round: int, history: RunHistory) -> None:
        if reply.has_error():
            log.warning("node %d cannot take part: %s", node, last_line(reply.error.reason))
            self.failures[node] = last_line(reply.error.reason)
            history.failed(server_round, node, reply.error.reason or "?")
            return
        info = reply.content.config_records.get(keys.INFO)
        sources = info.get(keys.SOURCES) if info is not None else None
        if not isinstance(sources, list):
            self.failures[node] = f"query reply lacks '{keys.SOURCES}'"
            history.failed(server_round, node, self.failures[node])
            return
        self.failures.pop(node, None)
        self.node_sources[node] = [str(s) for s in sources]
        for source in [
            s for s, n in self.owner.items() if n == node and s not in self.node_sources[node]
        ]:
            del self.owner[source]  # it restarted serving other data
        log.info("node %d serves %s", node, ", ".join(self.node_sources[node]) or "no source")

    def wait(
        self,
        grid: Grid,
        server_round: int,
        history: RunHistory,
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
            owners = self.refresh(grid, server_round, history) if enough else {}
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
