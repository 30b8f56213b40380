"""The bad nodes of :mod:`benchmarks.comparison.poisoning`: what each attack does to the
update a node sends after its honest training, and the ClientApp wrapper that does it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from flwr.app import Array, Context, Message, MessageType

from dept.wire import keys
from dept.wire.compression import SCALE_SUFFIX

Tamper = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]  # payload -> what is sent
DEFENDED = "+direction"  # the label suffix of a run with the direction check on


@dataclass(frozen=True)
class Attack:
    tamper: Tamper | None  # None: honest
    compression: str = "none"
    aggregation: str = "mean"
    outlier_action: str = "clip"
    nodes: int = 1  # how many tamper: the culprit and the sources after it in sorted order
    direction: bool = False  # the direction check on (direction-factor at its default)


def _values(arrays: dict[str, np.ndarray]) -> list[str]:
    """The arrays holding update values (not int8's block scales)."""
    return [n for n in arrays if not n.endswith(SCALE_SUFFIX)]


def _largest(arrays: dict[str, np.ndarray]) -> float:
    return max(float(np.abs(arrays[n]).max()) for n in _values(arrays))


def scaled(factor: float) -> Tamper:
    return lambda a: {n: v * np.float32(factor) if n in _values(a) else v for n, v in a.items()}


def signs_only(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value ±(the update's largest |value|), zeros left zero: no largest value is
    beyond an honest one, yet nothing but the signs is left."""
    top = np.float32(_largest(arrays))
    return {n: np.sign(v) * top if n in _values(arrays) else v for n, v in arrays.items()}


def _to_max(limit: float) -> Tamper:
    def tamper(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        factor = limit / _largest(arrays)
        return {n: (v.astype(np.float64) * factor).astype(v.dtype) for n, v in arrays.items()}

    return tamper


def _saturated(limit: float) -> Tamper:
    return lambda a: {n: np.where(v < 0, -limit, limit).astype(v.dtype) for n, v in a.items()}


def _int8_scales(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {n: v if n in _values(arrays) else v * np.float32(1e30) for n, v in arrays.items()}


def attacks(robust: str) -> dict[str, Attack]:
    """Every attack by label, with the direction check off and on (``+direction``)."""
    plain = {
        "honest": Attack(None),
        "x1e6": Attack(scaled(1e6)),
        "signs-only": Attack(signs_only),
        "reversed": Attack(scaled(-1.0)),
        "small-flip": Attack(scaled(-0.3)),
        "collude": Attack(scaled(-1.0), nodes=2),
        "x1e3": Attack(scaled(1e3)),
        "to-max": Attack(_to_max(3.3e38)),
        "saturated": Attack(_saturated(3.3e38)),
        "int8-scale": Attack(_int8_scales, compression="int8"),
        "fp16-max": Attack(_saturated(65504.0), compression="fp16"),
        "x1e6/reject": Attack(scaled(1e6), outlier_action="reject"),
        f"honest/{robust}": Attack(None, aggregation=robust),
        f"reversed/{robust}": Attack(scaled(-1.0), aggregation=robust),
    }
    return {
        label + suffix: replace(attack, direction=bool(suffix))
        for label, attack in plain.items()
        for suffix in ("", DEFENDED)
    }


def poisoning(app: Callable[[Message, Context], Message], bad: list[str], tamper: Tamper) -> Any:
    """``app`` whose training replies for the sources ``bad`` are passed through ``tamper``
    (bad nodes: their own training is honest, what they send is not)."""

    def bad_node(msg: Message, context: Context) -> Message:
        reply = app(msg, context)
        config = msg.content.config_records.get(keys.CONFIG)
        if (
            msg.metadata.message_type == MessageType.TRAIN
            and config is not None
            and config.get(keys.SOURCE) in bad
            and reply.has_content()
        ):
            arrays = reply.content.array_records[keys.ARRAYS]
            sent = {n: arrays[n].numpy() for n in arrays if n != keys.EMBEDDING_IDS}
            for name, value in tamper(sent).items():
                arrays[name] = Array(value)
        return reply

    return bad_node
