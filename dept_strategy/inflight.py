"""Which source each message in flight was for, so every reply (or its absence) is credited
to the right node and source.

Replies are matched by ``reply_to_message_id`` (the grid writes the message id into each
sent message): a node may serve several sources, and an error reply made by the SuperLink
(node gone, reply expired) carries the SuperLink's id as its sender, not the node's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from flwr.app import Message


@dataclass(frozen=True)
class Target:
    node: int
    source: str


class InFlight:
    """The messages of one send-and-receive, by message id once they are sent."""

    def __init__(self) -> None:
        self._sent: list[tuple[Message, Target]] = []
        self._index: dict[str, Target] | None = None  # built once the ids exist

    def track(self, message: Message, target: Target) -> None:
        self._sent.append((message, target))
        self._index = None

    def _by_id(self) -> dict[str, Target]:
        if self._index is None or len(self._index) < len(self._sent):  # ids appear on send
            self._index = {m.metadata.message_id: t for m, t in self._sent if m.metadata.message_id}
        return self._index

    def target_of(self, reply: Message) -> Target | None:
        """The node and source the replied-to message was sent for (None if not ours)."""
        return self._by_id().get(reply.metadata.reply_to_message_id)

    def unanswered(self, answered_ids: Iterable[str]) -> list[Target]:
        """Targets whose message got no reply at all (timed out), given the ids of the
        messages that were answered; then forget them all."""
        answered = set(answered_ids)
        missing = [t for mid, t in self._by_id().items() if mid not in answered]
        self._sent, self._index = [], None
        return missing
