"""A Grid that hands messages straight to a ClientApp in this process.

Drives the real ServerApp logic against the real ClientApp in seconds (no SuperLink, no
Ray): for tests and benchmarks. Each node gets its own Context, kept across rounds as the
runtime does; an exception in the ClientApp becomes an error reply, as in the runtime.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

ClientAppLike = ClientApp | Callable[[Message, Context], Message]  # tests wrap the app


class LocalGrid(Grid):
    """Nodes ``1..N`` with the given node configs, all served by ``client_app``."""

    def __init__(
        self,
        client_app: ClientAppLike,
        node_configs: list[dict[str, Any]],
        run_config: dict[str, Any],
    ) -> None:
        self.client_app = client_app
        # Message() reads the sender's identity from this process-wide holder, which the
        # runtime fills in; here this process plays the ServerApp (node 0) of run 1.
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
        self.contexts = {
            i + 1: Context(
                run_id=1,
                node_id=i + 1,
                node_config=dict(nc),
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i, nc in enumerate(node_configs)
        }
        self.down: set[int] = set()  # nodes that stop answering (simulated failure)
        self._replies: dict[str, Message] = {}
        self._run: Any = None

    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # the SuperLink's job
            if msg.metadata.dst_node_id not in self.down:
                self._replies[msg.metadata.message_id] = self._deliver(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def _deliver(self, msg: Message) -> Message:
        context = self.contexts[msg.metadata.dst_node_id]
        try:
            reply = self.client_app(msg, context)
        except Exception as exc:  # what the runtime does with a ClientApp exception
            reply = Message(
                Error(
                    code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                    reason=f"{type(exc).__name__}: {exc}",
                ),
                reply_to=msg,
            )
        return reply

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
