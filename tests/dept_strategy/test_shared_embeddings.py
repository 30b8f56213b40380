"""DeptStrategy with a shared φ: GLOB's whole-model FedAvg, TRIM's rows and queries."""

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, RecordDict

from dept.wire import keys
from dept_strategy.outer import OuterOptimizer
from dept_strategy.strategy import DeptStrategy
from server_app.local_grid import LocalGrid
from tests.dept_strategy.mock_replies import (
    BODY,
    assert_rows_averaged_over_senders,
    mock_strategy,
    train_reply,
)
from tests.helpers import directory_app

PHI = torch.arange(10, dtype=torch.float32).reshape(5, 2)


def _shared_strategy(trim: bool) -> DeptStrategy:
    return mock_strategy(
        outer=OuterOptimizer({**BODY, "input": PHI}, kind="fedavg"),
        embedding_names=("input",),
        trim=trim,
    )


def _trim_reply(
    strategy: DeptStrategy, node: int, rows: list[int], value: float, w: float
) -> Message:
    body = {"a": np.full((2, 3), value, np.float32), "b": np.full(4, value, np.float32)}
    phi = np.full((len(rows), 2), value, np.float32)
    reply = train_reply(strategy, node, {**body, "input": phi}, w, f"s{node}")
    reply.content.array_records[keys.ARRAYS][keys.EMBEDDING_IDS] = Array(np.asarray(rows, np.int32))
    return reply


def test_trim_averages_each_row_over_the_clients_that_hold_it() -> None:
    # Prepare: s1 holds rows 0, 1; s2 holds rows 1, 2; nobody holds rows 3, 4
    strategy = _shared_strategy(trim=True)
    assert strategy.vocabularies is not None
    strategy.vocabularies.ids = {
        "s1": np.array([0, 1]),
        "s2": np.array([1, 2]),
        "s3": np.array([3]),
    }
    replies = [
        _trim_reply(strategy, 1, [0, 1], 1.0, 1),
        _trim_reply(strategy, 2, [1, 2], 3.0, 3),
        _trim_reply(strategy, 3, [4], 9.0, 1),  # claims a row it was not sent
    ]
    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)
    # Assert
    assert_rows_averaged_over_senders(arrays, PHI)
    [rejected] = strategy.history.rounds[1].rejected
    assert rejected["source"] == "s3" and keys.EMBEDDING_IDS in rejected["reason"]


def test_glob_is_fedavg_on_the_whole_model() -> None:
    strategy = _shared_strategy(trim=False)
    full = {**BODY, "input": PHI}
    clients = [
        {k: (v + 1.0).numpy() for k, v in full.items()},
        {k: (v * 2.0).numpy() for k, v in full.items()},
    ]
    weights = [1.0, 3.0]
    replies = [
        train_reply(strategy, i + 1, {k: full[k].numpy() - c[k] for k in full}, w, f"s{i + 1}")
        for i, (c, w) in enumerate(zip(clients, weights, strict=True))
    ]
    arrays, _ = strategy.aggregate_train(1, replies)
    for name in full:
        fedavg = (weights[0] * clients[0][name] + weights[1] * clients[1][name]) / sum(weights)
        assert np.allclose(arrays[name].numpy(), fedavg, atol=1e-6), name


def test_trim_asks_each_vocabulary_once_and_sends_only_those_rows() -> None:
    asked: list[str] = []
    vocab = {"x": [0, 2], "y": [1, 2, 4]}

    def app(msg: Message, context) -> Message:
        config = msg.content.config_records[keys.CONFIG]
        if config.get(keys.REQUEST) != keys.VOCABULARY:
            return directory_app({1: ["x"], 2: ["y"]})(msg, context)
        asked.append(str(config[keys.SOURCE]))
        arrays = ArrayRecord({keys.EMBEDDING_IDS: Array(np.asarray(vocab[config[keys.SOURCE]]))})
        info = ConfigRecord({keys.SOURCE: config[keys.SOURCE]})
        return Message(RecordDict({keys.ARRAYS: arrays, keys.INFO: info}), reply_to=msg)

    grid = LocalGrid(app, [{}] * 2, {})
    strategy = _shared_strategy(trim=True)
    shared = ArrayRecord(strategy.outer.tensors())
    sent = 0
    for server_round in (1, 2):
        messages = strategy.configure_train(server_round, shared, ConfigRecord(), grid)
        for msg in messages:
            sent += msg.content.array_records[keys.ARRAYS].count_bytes()
            source = msg.content.config_records[keys.CONFIG][keys.SOURCE]
            phi = msg.content.array_records[keys.ARRAYS]["input"].numpy()
            assert np.array_equal(phi, PHI.numpy()[vocab[source]])
    assert sorted(asked) == ["x", "y"], "V_k is asked once per source"
    assert strategy.history.comm.bytes_down == sent < 2 * 2 * shared.count_bytes()


def _query_app(failing: str):
    """Node 1 serves ``a``; node 2 fails its discovery query, or serves ``b`` and fails
    the query for b's vocabulary."""
    discovery = directory_app({1: ["a"], 2: ["b"]} if failing == "vocabulary" else {1: ["a"]})

    def app(msg: Message, context) -> Message:
        config = msg.content.config_records[keys.CONFIG]
        if config.get(keys.REQUEST) != keys.VOCABULARY:
            return discovery(msg, context)
        if config[keys.SOURCE] == "b":
            return Message(Error(code=2, reason="Traceback...\nOSError: no corpus"), reply_to=msg)
        arrays = ArrayRecord({keys.EMBEDDING_IDS: Array(np.asarray([0, 2]))})
        info = ConfigRecord({keys.SOURCE: config[keys.SOURCE]})
        return Message(RecordDict({keys.ARRAYS: arrays, keys.INFO: info}), reply_to=msg)

    return app


@pytest.mark.parametrize(
    ("failing", "failure"),
    [
        ("discovery", {"node": "2", "reason": "ConfigError: source 'x': no data"}),
        ("vocabulary", {"node": "2", "source": "b", "reason": "OSError: no corpus"}),
    ],
)
def test_a_round_whose_queries_fail_still_has_its_global_step(failing: str, failure: dict) -> None:
    # Prepare: the failed query is the first thing that happens in round 3 (TRIM)
    grid = LocalGrid(_query_app(failing), [{}] * 2, {})
    strategy = _shared_strategy(trim=True)
    # Execute
    [message] = strategy.configure_train(3, strategy.shared_tensors(), ConfigRecord(), grid)
    # Assert: the row has the step the clients were sent, the start of round 3's training
    row = strategy.history.round_json(3)
    assert row["global_step"] == message.content[keys.CONFIG][keys.GLOBAL_STEP] == 2 * 5
    assert row["failed"] == [failure] and row["sampled"] == 1
