"""Which node serves which source: asked of every new node with a ``query`` message.

DEPT samples *sources* each round (Algorithm 1), while Flower addresses *nodes*. Every node
that connects is asked once which sources it serves (a deployed SuperNode: the one in its
node config; a simulated one: its share of the run's sources), so the strategy can sample
sources, address the right node, and pick up nodes that join a running federation. A node
that answers with an error (bad node config, unreadable data) is logged with its reason and
asked again the next round (once per round, so a broken node does not flood the log).

A query can also be lost: Flower drops a message whose ClientApp process dies or whose run
token was revoked, without an error reply. So a query is never waited on alone: it stays
pending, its reply is taken whenever it comes (also in a later round), and a node whose
query goes unanswered is asked again after ``reask_after_s``, then after twice that, and so
on, so that one lost message cannot stall the wait for a resumed run's sources. A node that
was away (off Flower's list of connected nodes: a partition, a paused machine) is asked again
as soon as it is back: its query was lost with it, or answered "Node Unavailable" for it,
so the node trains in the next round rather than after the re-ask's wait.

A source has one node at a time: the first that served it keeps it while it is connected,
and a second node claiming it is refused (both ids logged, the conflict recorded) instead of
taking its place. Where nodes authenticate, a source can be pinned to a node key
(:mod:`dept_strategy.identity`): only a node with that key may serve it, so a stranger's
node cannot take over a source whose own node is down.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from flwr.app import Message
from flwr.serverapp import Grid

from dept.wire import keys
from dept_strategy.history import RunHistory
from dept_strategy.identity import fingerprint, node_keys
from dept_strategy.queries import discovery_queries
from dept_strategy.validation import last_line

log = logging.getLogger(__name__)
FAIL_FAST_GRACE_S = 10.0  # how long the node set must stay unchanged before giving up early
REASK_AFTER_S = 60.0  # a query unanswered this long is sent again (the wait then doubles)
POLL_S = 0.5


def _same_key(keys_of: dict[int, bytes], a: int, b: int) -> bool:
    """Both nodes authenticated with one key: the same node, restarted under a new id."""
    return bool(keys_of.get(a)) and keys_of.get(a) == keys_of.get(b)


@dataclass
class NodeQueries:
    """What asking one node has brought so far."""

    asked_in_round: int = -1  # the round it was last asked in
    unanswered: int = 0  # queries sent since its last answer
    last_sent: float = 0.0
    errors: int = 0  # error answers since its last good one
    last_error: float = 0.0
    failure: str = ""  # why it could not (yet) say what it serves
    silent: bool = False  # the failure is queries gone unanswered
    returned: bool = False  # back from away before it said what it serves: ask now


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
        reask_after_s: float = REASK_AFTER_S,
    ) -> None:
        """``pinned``: source → the DER public key its node must authenticate with;
        ``query_timeout_s``: how long a round waits for a node asked for the first time."""
        self.run_id = run_id
        self.min_nodes = max(1, min_nodes)
        self.wait_s = wait_s
        self.query_timeout_s = query_timeout_s
        self.reask_after_s = reask_after_s
        self.pinned = pinned or {}
        self.node_sources: dict[int, list[str]] = {}  # in the order nodes first answered
        self.queries: dict[int, NodeQueries] = {}  # node -> what asking it brought
        self.pending: dict[str, int] = {}  # query message id -> the node it asks
        # nodes that answered only once asked again: Flower's SuperNode may be holding a
        # reply back there (server_app/nudges.py, which nudges them)
        self.behind: set[int] = set()
        self.owner: dict[str, int] = {}  # source -> the node serving it
        self.refused: set[tuple[str, int]] = set()  # (source, node) conflicts already reported
        self.conflicts: list[dict[str, str]] = []  # what was refused, for the run's report
        self.connected: set[int] = set()  # the nodes connected at the last look (observe)

    def refresh(
        self, grid: Grid, server_round: int, history: RunHistory, *, patience_s: float | None = None
    ) -> dict[str, int]:
        """Take the replies that came, ask nodes not yet known (a node that cannot answer
        goes into ``history``) and wait up to ``patience_s`` (default: ``query_timeout_s``)
        for those asked for the first time; return ``{source: node}`` for the connected
        nodes."""
        self.observe(set(grid.get_node_ids()))
        connected = self.connected
        self._collect(grid, server_round, history)  # replies to earlier asks
        now = time.monotonic()
        due = [
            n
            for n in sorted(connected - self.node_sources.keys())
            if self._due(n, now, server_round)
        ]
        first = [n for n in due if not self._of(n).unanswered]
        self._ask_now(grid, due, server_round, history)
        patience = self.query_timeout_s if patience_s is None else patience_s
        deadline = time.monotonic() + patience
        while True:
            self._collect(grid, server_round, history)
            if not any(self.queries[n].unanswered for n in first) or time.monotonic() >= deadline:
                break
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            self.observe(set(grid.get_node_ids()))  # one that was away may be back meanwhile
            back = [
                n for n in sorted(self.connected - self.node_sources.keys()) if self._of(n).returned
            ]
            self._ask_now(grid, back, server_round, history)
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

    def _due(self, node: int, now: float, server_round: int) -> bool:
        """Ask ``node`` now: its query is overdue, or it has none pending and was not asked
        this round; a node that answered an error is asked again the next round, or within
        the round on the same backoff (it may have been away: "Node Unavailable")."""
        state = self._of(node)
        if state.returned:
            return True
        if state.unanswered:
            return now - state.last_sent >= self.reask_after_s * 2 ** (state.unanswered - 1)
        if state.asked_in_round != server_round:
            return True
        return bool(state.errors) and (
            now - state.last_error >= self.reask_after_s * 2 ** (state.errors - 1)
        )

    def observe(self, connected: set[int]) -> None:
        """Note the nodes connected now: one back after being off the list (a partition, a
        paused machine) that has not said what it serves (its query lost, or answered for it
        by Flower: "Node Unavailable") is asked again at once."""
        for node in connected - self.connected:
            if node in self.queries and node not in self.node_sources:
                self.queries[node].returned = True
        self.connected = connected

    def _ask_now(
        self, grid: Grid, nodes: list[int], server_round: int, history: RunHistory
    ) -> None:
        now = time.monotonic()
        for node in nodes:
            self._note_silence(node, now, server_round, history)
        if nodes:
            self._ask(grid, nodes, server_round)

    def _note_silence(self, node: int, now: float, server_round: int, history: RunHistory) -> None:
        """An overdue query: logged and written down before the node is asked again."""
        state = self._of(node)
        if not state.unanswered:
            return
        ago = now - state.last_sent
        state.failure = f"no answer to {state.unanswered} query(ies), the last {ago:.0f} s ago"
        if state.returned:
            state.failure += ", before it was away"
        state.silent = True
        why = f"did not say which sources it serves: {state.failure}"
        log.warning("node %d %s; asking again", node, why)
        history.failed(server_round, node, why)

    def _of(self, node: int) -> NodeQueries:
        return self.queries.setdefault(node, NodeQueries())

    def _ask(self, grid: Grid, nodes: list[int], server_round: int) -> None:
        messages = discovery_queries(nodes, self.run_id)
        now = time.monotonic()
        for node, message_id in zip(nodes, grid.push_messages(messages), strict=True):
            self.pending[message_id] = node
            state = self._of(node)
            state.asked_in_round = server_round
            state.returned = False
            state.unanswered += 1
            state.last_sent = now

    def _collect(self, grid: Grid, server_round: int, history: RunHistory) -> None:
        """Learn from every reply that came for a pending query, in the order they came."""
        if not self.pending:
            return
        for reply in grid.pull_messages(list(self.pending)):
            node = self.pending.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            for message_id in [m for m, n in self.pending.items() if n == node]:
                del self.pending[message_id]  # its other asks are answered by this one
            state = self._of(node)
            if state.unanswered > 1:
                self.behind.add(node)
            state.unanswered, state.silent = 0, False
            self._learn(node, reply, server_round, history)

    def again(self) -> None:
        """The round is tried again (it trained nothing): the nodes let go in it are asked
        at once, not only in the next round."""
        for node, state in self.queries.items():
            if node not in self.node_sources:
                state.asked_in_round = -1

    def forget(self, node: int) -> None:
        """Ask ``node`` again next round (it failed: it may have restarted with other data).
        It keeps its sources meanwhile, so no other node takes them over; what it no longer
        serves when it answers again is let go then."""
        self.node_sources.pop(node, None)

    def _learn(self, node: int, reply: Message, server_round: int, history: RunHistory) -> None:
        state = self._of(node)
        if reply.has_error():
            state.errors, state.last_error = state.errors + 1, time.monotonic()
            state.failure = last_line(reply.error.reason)
            log.warning("node %d cannot take part: %s", node, state.failure)
            history.failed(server_round, node, reply.error.reason or "?")
            return
        info = reply.content.config_records.get(keys.INFO)
        sources = info.get(keys.SOURCES) if info is not None else None
        if not isinstance(sources, list):
            state.failure = f"query reply lacks '{keys.SOURCES}'"
            history.failed(server_round, node, state.failure)
            return
        state.failure, state.errors = "", 0
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
            self.observe(nodes)  # also while too few are there to ask
            if nodes != seen:
                seen, stable_since = nodes, time.monotonic()
                # said at once: the first answers wait for each ClientApp to start (tens of s)
                log.info(
                    "%d node(s) connected; asking which sources they serve (%d required)",
                    len(nodes),
                    self.min_nodes,
                )
            enough = len(nodes) >= self.min_nodes
            patience = max(0.0, min(self.reask_after_s, deadline - time.monotonic()))
            owners = (
                self.refresh(grid, server_round, history, patience_s=patience) if enough else {}
            )
            if owners and expected <= owners.keys():
                return owners
            idle = {n for n, served in self.node_sources.items() if not served}
            failed = {n for n, q in self.queries.items() if q.failure and not q.silent}
            hopeless = enough and nodes <= failed | idle
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
            time.sleep(POLL_S)

    def _reasons(self) -> str:
        return "; ".join(
            f"node {n}: {q.failure}" for n, q in sorted(self.queries.items()) if q.failure
        )
