"""One exchange of ``query`` messages: one to each target, the replies credited, the silent
named. TRIM's vocabularies (:mod:`dept_strategy.vocabularies`) ask their nodes this way;
discovery keeps its queries pending instead (:mod:`dept_strategy.discovery`).
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from dept.wire import keys
from dept_strategy.inflight import InFlight, Target


def query(node: int, config: ConfigRecord) -> Message:
    """A ``query`` message for ``node`` carrying ``config``."""
    return Message(
        RecordDict({keys.CONFIG: config}), dst_node_id=node, message_type=MessageType.QUERY
    )


def discovery_queries(nodes: list[int], run_id: str) -> list[Message]:
    """One "which sources do you serve in run ``run_id``" query per node, in a list (Flower's
    grids read what they are given more than once)."""
    config = ConfigRecord({keys.RUN_ID: run_id})
    return [query(node, config) for node in nodes]


def send_queries(
    grid: Grid, queries: list[tuple[Target, ConfigRecord]], timeout_s: float
) -> tuple[list[tuple[Target | None, Message]], list[Target]]:
    """Send each ``(target, config)`` as a query to its node and wait up to ``timeout_s``:
    ``(replies, silent)``, each reply with the target its message was for (None for a reply
    to none of them), and the targets that got no reply."""
    in_flight = InFlight()  # credits a reply the SuperLink made (node gone) to its node
    messages = []
    for target, config in queries:
        message = query(target.node, config)
        in_flight.track(message, target)
        messages.append(message)
    replies = list(grid.send_and_receive(messages, timeout=timeout_s))
    credited = [(in_flight.target_of(reply), reply) for reply in replies]
    return credited, in_flight.unanswered(r.metadata.reply_to_message_id for r in replies)
