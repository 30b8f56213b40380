"""The sub-8-bit codecs through the path a real reply takes: DeptStrategy.aggregate_train
decodes good payloads and refuses each malformed one, naming what is wrong."""

from collections.abc import Callable

import numpy as np
import pytest
import torch

from dept.wire.compression import INDEX_SUFFIX, SCALE_SUFFIX, decode, encode
from tests.dept_strategy.mock_replies import BODY, mock_strategy, train_reply

Payload = dict[str, torch.Tensor]
SHAPES = {name: tuple(value.shape) for name, value in BODY.items()}  # a: (2, 3), b: (4,)
DENSITY = 0.5  # top-k keeps 3 of a's 6 values, 2 of b's 4
DELTA = {
    "a": torch.tensor([[0.4, -1.0, 0.1], [0.7, -0.2, 0.05]]),
    "b": torch.tensor([2, -1, 0.5, 3]),
}


def _set(name: str, index: int, value: float) -> Callable[[Payload], None]:
    def change(payload: Payload) -> None:
        payload[name] = payload[name].clone()
        payload[name][index] = value

    return change


def _replace(name: str, make: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Payload], None]:
    def change(payload: Payload) -> None:
        payload[name] = make(payload[name])

    return change


MALFORMED: dict[str, list[tuple[str, Callable[[Payload], None], str]]] = {
    "int8": [
        ("code-128", _set("b", 0, -128), r"'b' holds codes outside [-127, 127]"),
    ],
    "int4": [
        ("code-15", _set("a", 0, 0xFF), r"'a' holds codes outside [-7, 7]"),
        ("short", _replace("a", lambda v: v[:-1]), "'a' has shape (2,), expected (3,)"),
        ("signed", _replace("a", lambda v: v.to(torch.int8)), "dtype int8, expected uint8"),
        ("nan-scale", _set("b" + SCALE_SUFFIX, 0, float("nan")), "finite scales"),
    ],
    "int2": [
        ("code-3", _set("b", 0, 0xFF), r"'b' holds codes outside [-1, 1]"),
        ("long", _replace("b", lambda v: torch.cat([v, v])), "'b' has shape (2,), expected (1,)"),
        ("no-scale", lambda p: p.pop("a" + SCALE_SUFFIX), "missing ['a@scale']"),
    ],
    "ternary": [
        ("byte-243", _set("b", 0, 243), r"'b' holds a byte >= 243, not 5 base-3 codes"),
        ("long", _replace("a", lambda v: torch.cat([v, v])), "'a' has shape (4,), expected (2,)"),
    ],
    "topk": [
        ("out-of-range", _set("a" + INDEX_SUFFIX, -1, 6), "indices outside [0, 6)"),
        ("negative", _set("b" + INDEX_SUFFIX, 0, -1), "indices outside [0, 4)"),
        ("duplicate", _set("a" + INDEX_SUFFIX, 1, 0), "without duplicates"),  # [0, 1, 3]
        ("long", _replace("b", lambda v: torch.cat([v, v[:1]])), "'b' has shape (3,)"),
        ("int64", _replace("b" + INDEX_SUFFIX, torch.Tensor.long), "expected int32"),
        ("float32", _replace("a", torch.Tensor.float), "float32, expected float16"),
        ("nan-value", _set("a", 0, float("nan")), "'a' holds NaN or infinite values"),
        ("no-index", lambda p: p.pop("b" + INDEX_SUFFIX), "missing ['b@index']"),
    ],
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_codec_replies_are_decoded_and_malformed_ones_rejected(kind: str) -> None:
    # Prepare: one good reply, then one reply per way of breaking its payload
    strategy = mock_strategy(compression=kind, topk_density=DENSITY)
    good = encode(DELTA, kind, DENSITY)
    replies = [train_reply(strategy, 1, good, 1, "good")]
    for node, (label, break_it, _) in enumerate(MALFORMED[kind], start=2):
        payload = dict(good)
        break_it(payload)
        replies.append(train_reply(strategy, node, payload, 1, label))
    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)
    # Assert: the body moved by the good reply's decoded Δ only; each other one named
    assert arrays is not None
    sent = decode(good, SHAPES, kind, DENSITY)
    for name in SHAPES:
        assert np.allclose(arrays[name].numpy(), (BODY[name] - sent[name]).numpy()), name
    record = strategy.history.rounds[1]
    assert list(record.train) == ["good"]
    reasons = {r["source"]: r["reason"] for r in record.rejected}
    for label, _, reason in MALFORMED[kind]:
        assert reason in reasons[label], (label, reasons[label])


def test_a_density_other_than_the_servers_is_refused() -> None:
    # Prepare: a source configured with density 0.25 (a: 2 values), the server with 0.5
    strategy = mock_strategy(compression="topk", topk_density=DENSITY)
    reply = train_reply(strategy, 1, encode(DELTA, "topk", 0.25), 1, "sparser")
    # Execute
    arrays, _ = strategy.aggregate_train(1, [reply])
    # Assert
    assert arrays is None
    (rejected,) = strategy.history.rounds[1].rejected
    assert "'a' has shape (2,), expected (3,)" in rejected["reason"]
    with pytest.raises(ValueError, match=r"topk-density. must be in"):
        mock_strategy(compression="topk", topk_density=0.0)
