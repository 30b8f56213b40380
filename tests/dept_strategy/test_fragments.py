"""DeptStrategy with partial synchronisation, against mock replies: what each source is
sent, which replies are refused, and each fragment's own outer step."""

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message

from dept.wire import keys
from dept_strategy.outer import OuterOptimizer
from dept_strategy.screening import Defences
from server_app.local_grid import LocalGrid
from tests.dept_strategy.mock_replies import instruction_to, mock_strategy, train_reply
from tests.helpers import directory_app

# two layers: fragment 0 is layer 0, fragment 1 layer 1 (with the norm outside the layers)
BODY = {"l.0.w": torch.ones(2, 3), "l.1.w": torch.ones(4), "norm": torch.ones(2)}
FRAGMENT_1 = ("l.1.w", "norm")


def _strategy(**kwargs):
    return mock_strategy(
        outer=OuterOptimizer(BODY, kind="nesterov", lr=0.7, momentum=0.9),
        fragments=2,
        fragment_period=2,
        **kwargs,
    )


def _delta(value: float, names=FRAGMENT_1) -> dict[str, np.ndarray]:
    return {n: np.full(BODY[n].shape, value, np.float32) for n in names}


def _sent(strategy, server_round: int, grid: LocalGrid) -> dict[str, set[str]]:
    body = ArrayRecord(strategy.outer.tensors())
    messages = strategy.configure_train(server_round, body, ConfigRecord(), grid)
    return {
        m.content.config_records[keys.CONFIG][keys.SOURCE]: set(m.content[keys.ARRAYS].keys())
        for m in messages
    }


def test_a_round_takes_only_its_fragment_and_steps_it_alone() -> None:
    # Prepare: round 1 syncs fragment 1; a good reply, one with fragment 0 too, one misshapen
    strategy = _strategy()
    wrong_shape = {**_delta(1.0), "norm": np.zeros(3, np.float32)}
    replies = [
        train_reply(strategy, 1, _delta(1.0), 1, "good"),
        train_reply(strategy, 2, _delta(1.0, tuple(BODY)), 1, "whole"),
        train_reply(strategy, 3, wrong_shape, 1, "misshapen"),
    ]
    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)
    # Assert: fragment 1 moved by the Nesterov step, fragment 0 and its state untouched
    assert arrays is not None
    assert np.array_equal(arrays["l.0.w"].numpy(), BODY["l.0.w"].numpy())
    assert np.allclose(arrays["l.1.w"].numpy(), 1 - 0.7 * (1 + 0.9))
    state = strategy.outer.optimizer.state
    assert strategy.outer.params["l.0.w"] not in state
    record = strategy.history.rounds[1]
    assert list(record.train) == ["good"]
    reasons = {r["source"]: r["reason"] for r in record.rejected}
    assert "unexpected ['l.0.w']" in reasons["whole"]
    assert "'norm' has shape (3,), expected (2,)" in reasons["misshapen"]
    assert strategy.fragments.versions == [0, 1]
    assert strategy.fragments.held == {"good": [0, 0]}


def test_a_source_is_sent_what_changed_since_it_last_counted() -> None:
    # Prepare: sources a (trained round 1) and b (never)
    grid = LocalGrid(directory_app({1: ["a"], 2: ["b"]}), [{}] * 2, {})
    strategy = _strategy()
    assert _sent(strategy, 1, grid) == {"a": set(BODY), "b": set(BODY)}
    strategy.aggregate_train(1, [train_reply(strategy, 1, _delta(1.0), 1, "a")])
    # Execute
    sent = _sent(strategy, 2, grid)
    # Assert: a gets only fragment 1 (stepped in round 1), b the whole body
    assert sent == {"a": set(FRAGMENT_1), "b": set(BODY)}
    record = strategy.history.rounds[2]
    whole = ArrayRecord(strategy.outer.tensors()).count_bytes()
    part = ArrayRecord({n: strategy.outer.tensors()[n] for n in FRAGMENT_1}).count_bytes()
    assert record.bytes_down == whole + part


def test_fragment_state_survives_a_checkpoint_and_an_error_resets_a_source() -> None:
    strategy = _strategy()
    strategy.aggregate_train(1, [train_reply(strategy, 1, _delta(1.0), 1, "a")])
    tensors, meta = strategy.state_dict()
    again = _strategy()
    again.resume(tensors, meta, 1)
    assert again.fragments.state_dict() == strategy.fragments.state_dict()
    assert again.fragments.unsent("a") == {"l.0.w"}
    # a node that answers with an error may have lost its body: the whole of it next time
    failed = Message(
        Error(code=2, reason="fragment 0 of the body was not sent"),
        reply_to=instruction_to(again, 1, "a"),
    )
    again.aggregate_train(2, [failed])
    assert again.fragments.unsent("a") == set()


def test_one_fragment_sends_the_whole_body_without_fragment_keys() -> None:
    grid = LocalGrid(directory_app({1: ["a"]}), [{}], {})
    strategy = mock_strategy(outer=OuterOptimizer(BODY, kind="fedavg"))
    body = ArrayRecord(strategy.outer.tensors())
    (message,) = strategy.configure_train(1, body, ConfigRecord(), grid)
    config = message.content.config_records[keys.CONFIG]
    assert keys.FRAGMENT_VERSIONS not in config and keys.FRAGMENT_SYNC not in config
    assert set(message.content[keys.ARRAYS].keys()) == set(BODY)


def test_a_fragment_is_bounded_over_the_rounds_since_its_base_as_the_server_sent_it() -> None:
    # Prepare: one round's training moves a weight 0.01 at most; round 1 syncs fragment 1
    strategy = _strategy(defences=Defences(reach=lambda rounds, biggest: 0.01 * len(rounds)))
    strategy.aggregate_train(1, [train_reply(strategy, 1, _delta(0.005), 1, "a")])
    # Execute: round 3 syncs it again; its Δ holds rounds 2 and 3 (its base came of round 1)
    honest = train_reply(strategy, 1, _delta(0.015), 1, "a")
    loud = train_reply(strategy, 2, _delta(0.15), 1, "b")
    # a node that says its base is the initial body's (three rounds) gets no more room
    claims = train_reply(strategy, 3, _delta(0.025), 1, "c")
    claims.content.config_records[keys.INFO][keys.FRAGMENT_VERSIONS] = [0, 0]
    strategy.aggregate_train(3, [honest, loud, claims])
    # Assert: two rounds' worth passes; ten times that, or three rounds', is clipped
    clipped = {c["source"]: c["reason"] for c in strategy.history.rounds[3].clipped}
    assert clipped.keys() == {"b", "c"}
    assert "beyond what this round's local training can move a weight (0.01)" in clipped["c"]
    assert list(strategy.history.rounds[3].train) == ["a", "b", "c"]
