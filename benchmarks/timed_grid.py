"""An in-process grid that records, per message, what it cost: wall time and wire bytes.

It is :class:`server_app.local_grid.LocalGrid` (the real ClientApp called directly) with a
ledger: each delivered message's type, source, seconds in the ClientApp, and the size of
the instruction and the reply as the runtime would put them on the wire (the protobuf the
SuperLink forwards, ``flwr.common.serde.message_to_proto``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Message
from flwr.common.serde import message_to_proto

from dept.wire import keys
from dept_cli.in_process import federate_in_process, in_process_grid
from server_app.local_grid import LocalGrid


@dataclass
class Delivery:
    message_type: str
    server_round: int
    source: str
    seconds: float
    cpu_seconds: float  # this process's CPU time: steadier than wall time on a busy machine
    wire_bytes_down: int
    wire_bytes_up: int
    metrics: dict[str, Any]


class TimedGrid(LocalGrid):
    """LocalGrid plus :attr:`deliveries`, one :class:`Delivery` per message handled."""

    def __init__(self, *args: Any, wire_bytes: bool = False, **kwargs: Any) -> None:
        """``wire_bytes``: also serialise each message to protobuf to measure it (costs a
        copy of the payload, so it is off where only time matters)."""
        super().__init__(*args, **kwargs)
        self.wire_bytes = wire_bytes
        self.deliveries: list[Delivery] = []

    def _deliver(self, msg: Message) -> Message:
        started, cpu_started = time.perf_counter(), time.process_time()
        reply = super()._deliver(msg)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        content = reply.content if reply.has_content() else None
        metrics = content.metric_records.get(keys.METRICS) if content is not None else None
        config = msg.content.config_records[keys.CONFIG]
        self.deliveries.append(
            Delivery(
                message_type=msg.metadata.message_type,
                server_round=int(config.get(keys.SERVER_ROUND, -1)),  # type: ignore[arg-type]
                source=str(config.get(keys.SOURCE, "?")),
                seconds=seconds,
                cpu_seconds=cpu_seconds,
                wire_bytes_down=_wire(msg) if self.wire_bytes else 0,
                wire_bytes_up=_wire(reply) if self.wire_bytes else 0,
                metrics=dict(metrics) if metrics is not None else {},
            )
        )
        return reply


def _wire(message: Message) -> int:
    return message_to_proto(message).ByteSize()


def timed_federation(
    run_config: dict[str, Any], *, wire_bytes: bool = False
) -> tuple[Path, TimedGrid]:
    """Run the federation in process; its output folder and the grid with its ledger."""
    grid = in_process_grid(run_config, TimedGrid, wire_bytes=wire_bytes)
    assert isinstance(grid, TimedGrid)
    return federate_in_process(run_config, grid), grid
