"""Which source each message in flight was for, so every reply (or its absence) is credited
to the right node and source.

Replies are matched by ``reply_to_message_id`` (the grid writes the message id into each
sent message's metadata, which is all that is kept of it: the content, a serialised body of
up to 4.9 GB at 1.3b, is let go once the grid has sent it): a node may serve several
sources, and an error reply made by the SuperLink (node gone, reply expired) carries the
SuperLink's id as its sender, not the node's. A reply to a message that was not sent in this
exchange (unsolicited), or to one already answered (a duplicate), is credited to nobody:
:meth:`InFlight.claim` says why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from flwr.app import Message, Metadata


@dataclass(frozen=True)
class Target:
    node: int
    source: str


class InFlight:
    """The messages of one send-and-receive, by message id once they are sent."""

    def __init__(self) -> None:
        self._sent: list[tuple[Metadata, Target]] = []
        self._index: dict[str, Target] | None = None  # built once the ids exist
        self._answered: set[str] = set()

    def track(self, message: Message, target: Target) -> None:
        self._sent.append((message.metadata, target))
        self._index = None

    def sources(self) -> list[str]:
        """The sources of the messages in flight, sorted."""
        return sorted({t.source for _, t in self._sent})

    def _by_id(self) -> dict[str, Target]:
        if self._index is None or len(self._index) < len(self._sent):  # ids appear on send
            self._index = {m.message_id: t for m, t in self._sent if m.message_id}
        return self._index

    def target_of(self, reply: Message) -> Target | None:
        """The node and source the replied-to message was sent for (None if not ours)."""
        return self._by_id().get(reply.metadata.reply_to_message_id)

    def claim(self, reply: Message) -> tuple[Target | None, str]:
        """(whom ``reply`` is from, ""), the first time its message is answered; (None, why)
        for a reply that answers no message of this exchange or one answered already."""
        message_id = reply.metadata.reply_to_message_id
        target = self.target_of(reply)
        if target is None:
            return None, "unsolicited: it answers no message the server sent in this round"
        if message_id in self._answered:
            return None, f"duplicate: the message for source {target.source} was answered already"
        self._answered.add(message_id)
        return target, ""

    def unanswered(self, answered_ids: Iterable[str] = ()) -> list[Target]:
        """Targets whose message got no reply at all (timed out), given the ids of the
        messages answered besides those claimed; then forget them all."""
        answered = self._answered | set(answered_ids)
        missing = [t for mid, t in self._by_id().items() if mid not in answered]
        self._sent, self._index, self._answered = [], None, set()
        return missing
