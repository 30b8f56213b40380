"""DeptStrategy against mock replies: sampling, aggregation, credit, evaluation."""

import gc
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from dept.wire import keys
from dept_strategy.discovery import NotEnoughNodes
from server_app.local_grid import LocalGrid
from tests.dept_strategy.mock_replies import BODY, instruction_to, mock_strategy, train_reply
from tests.helpers import directory_app


def test_aggregates_good_replies_and_drops_bad_ones() -> None:
    # Prepare
    strategy = mock_strategy()
    d1 = {"a": np.full((2, 3), 1.0, np.float32), "b": np.full(4, 2.0, np.float32)}
    d2 = {"a": np.full((2, 3), -1.0, np.float32), "b": np.full(4, 6.0, np.float32)}
    nan = {**d1, "b": np.array([0, np.nan, 0, 0], np.float32)}
    replies = [
        train_reply(strategy, 1, d1, 1, "good-1"),
        train_reply(strategy, 2, d2, 3, "good-2"),
        train_reply(strategy, 3, {"a": d1["a"]}, 1, "missing-key"),
        train_reply(strategy, 4, {**d1, "b": np.zeros(5, np.float32)}, 1, "wrong-shape"),
        train_reply(strategy, 5, nan, 1, "nan"),
        train_reply(strategy, 6, d1, 0, "zero-weight"),
        train_reply(strategy, 7, {k: v.astype(np.float64) for k, v in d1.items()}, 1, "float64"),
        Message(
            Error(code=2, reason="Traceback...\nValueError: no data"),
            reply_to=instruction_to(strategy, 8, "broken"),
        ),
    ]
    # Execute
    arrays, metrics = strategy.aggregate_train(1, replies)
    # Assert
    expected_a = 1.0 - (1 * 1.0 + 3 * -1.0) / 4
    expected_b = 0.0 - (1 * 2.0 + 3 * 6.0) / 4
    assert np.allclose(arrays["a"].numpy(), expected_a) and np.allclose(
        arrays["b"].numpy(), expected_b
    )
    assert metrics[keys.NUM_EXAMPLES] == 4
    record = strategy.history.rounds[1]
    assert sorted(record.train) == ["good-1", "good-2"]
    reasons = {r["source"]: r["reason"] for r in record.rejected}
    assert set(reasons) == {"missing-key", "wrong-shape", "nan", "zero-weight", "float64"}
    assert "missing ['b']" in reasons["missing-key"] and "NaN" in reasons["nan"]
    assert record.failed == [{"node": "8", "source": "broken", "reason": "ValueError: no data"}]
    assert strategy.history.comm.bytes_up == sum(
        r.content.array_records[keys.ARRAYS].count_bytes() for r in replies[:7]
    )


def test_a_spool_the_strategy_made_itself_goes_with_it() -> None:
    # Prepare: no spool folder set, as in a strategy made outside a run
    strategy = mock_strategy()
    strategy.aggregate_train(
        1, [train_reply(strategy, 1, {"a": np.ones((2, 3), np.float32)}, 1, "s")]
    )
    spool = strategy.spool_dir
    assert spool is not None and spool.is_dir()
    # Execute
    del strategy
    gc.collect()
    # Assert: nothing left behind in the temporary folder
    assert not spool.exists()


def test_no_usable_reply_leaves_the_body_unchanged() -> None:
    strategy = mock_strategy()
    bad = train_reply(strategy, 1, {"a": np.zeros((2, 3), np.float32)}, 1, "x")
    assert strategy.aggregate_train(1, [bad]) == (None, None)
    assert torch.equal(strategy.outer.tensors()["a"], BODY["a"])


def test_fewer_usable_replies_than_min_train_replies_leave_the_body_unchanged() -> None:
    strategy = mock_strategy(min_train_replies=3)
    good = {"a": np.ones((2, 3), np.float32), "b": np.ones(4, np.float32)}
    replies = [train_reply(strategy, n, good, 1, f"s{n}") for n in (1, 2)]  # the third node is gone
    assert strategy.aggregate_train(1, replies) == (None, None)
    assert torch.equal(strategy.outer.tensors()["a"], BODY["a"])
    replies = [train_reply(strategy, n, good, 1, f"s{n}") for n in (1, 2, 3)]
    arrays, _ = strategy.aggregate_train(2, replies)
    assert np.allclose(arrays["a"].numpy(), 0.0)


def test_configure_train_samples_sources_and_sends_only_the_body() -> None:
    # Prepare: node 1 serves two sources, node 2 one, node 3 none, node 4 is broken
    grid = LocalGrid(directory_app({1: ["a", "c"], 2: ["b"], 3: []}), [{}] * 4, {})
    strategy = mock_strategy(fraction_train=0.67, min_train_nodes=1)
    body = ArrayRecord(strategy.outer.tensors())
    # Execute
    messages = list(strategy.configure_train(3, body, ConfigRecord(), grid))
    # Assert
    sources = {
        m.content.config_records[keys.CONFIG][keys.SOURCE]: m.metadata.dst_node_id for m in messages
    }
    assert len(sources) == 2 and all({"a": 1, "b": 2, "c": 1}[s] == n for s, n in sources.items())
    content = messages[0].content
    assert set(content.array_records[keys.ARRAYS].keys()) == set(BODY)
    config = content.config_records[keys.CONFIG]
    assert config[keys.GLOBAL_STEP] == 10 and config[keys.SERVER_ROUND] == 3
    assert strategy.history.comm.bytes_down == 2 * body.count_bytes()
    assert strategy.history.rounds[3].failed == [
        {"node": "4", "reason": "ConfigError: source 'x': no data"}
    ]
    everyone = mock_strategy(min_train_nodes=3, fraction_train=0.1)
    assert len(list(everyone.configure_train(1, body, ConfigRecord(), grid))) == 3


def test_waiting_for_nodes_is_bounded() -> None:
    grid = LocalGrid(directory_app({1: ["a"], 2: ["b"]}), [{}] * 2, {})
    with pytest.raises(NotEnoughNodes, match=r"for 5 node\(s\) .* saw 2 node"):
        mock_strategy(min_available_nodes=5).wait_for_sources(grid)
    assert mock_strategy(min_available_nodes=2).wait_for_sources(grid) == {"a": 1, "b": 2}


def test_per_source_evaluation_table() -> None:
    strategy = mock_strategy()
    replies = []
    for node, (source, bpb) in enumerate([("de", 1.5), ("fr", 2.5)], start=1):
        content = RecordDict(
            {
                keys.METRICS: MetricRecord({keys.VAL_BPB: bpb, keys.VAL_LOSS: 1.0}),
                keys.INFO: ConfigRecord({keys.SOURCE: source}),
            }
        )
        replies.append(Message(content, reply_to=instruction_to(strategy, node, source)))
    result = strategy.aggregate_evaluate(2, replies)
    assert math.isclose(result[keys.VAL_BPB], 2.0)
    assert strategy.history.rounds[2].eval["fr"][keys.VAL_BPB] == 2.5


def test_unreadable_arrays_and_inflated_weights_are_rejected_not_fatal() -> None:
    strategy = mock_strategy(max_tokens_per_round=1000)
    good = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.float32)}
    corrupt = train_reply(strategy, 1, good, 10, "corrupt")
    corrupt.content.array_records[keys.ARRAYS]["b"].data = b"not an npy payload"
    huge = train_reply(strategy, 2, {**good, "b": np.full(4, 1e30, np.float32)}, 1e20, "huge")
    arrays, _ = strategy.aggregate_train(
        1, [corrupt, huge, train_reply(strategy, 3, good, 10, "ok")]
    )
    reasons = {r["source"]: r["reason"] for r in strategy.history.rounds[1].rejected}
    assert "cannot be read" in reasons["corrupt"] and "num-examples" in reasons["huge"]
    assert np.isfinite(arrays["b"].numpy()).all()


def test_replies_are_credited_by_message_and_silence_is_reported() -> None:
    # Prepare: node 1 serves a and c, node 2 serves b, node 3 serves d
    grid = LocalGrid(directory_app({1: ["a", "c"], 2: ["b"], 3: ["d"]}), [{}] * 3, {})
    strategy = mock_strategy(num_server_rounds=4)
    body = ArrayRecord(strategy.outer.tensors())
    sent = list(strategy.configure_evaluate(4, body, ConfigRecord(), grid))
    for i, msg in enumerate(sent):  # what the grid does when it pushes them
        msg.metadata.__dict__["_message_id"] = f"m{i}"
    by_source = {m.content.config_records[keys.CONFIG][keys.SOURCE]: m for m in sent}

    def answer(source: str, said: str, bpb) -> Message:
        metrics = MetricRecord({keys.VAL_BPB: bpb})
        content = RecordDict({keys.METRICS: metrics, keys.INFO: ConfigRecord({keys.SOURCE: said})})
        return Message(content, reply_to=by_source[source])

    expired = Message(Error(code=5, reason="node unavailable"), reply_to=by_source["d"])
    expired.metadata.__dict__["_src_node_id"] = 1  # the SuperLink makes such replies itself
    replies = [answer("a", "a", 1.0), answer("b", "b", [1.0, 2.0]), expired]  # c: silence

    # Execute
    result = strategy.aggregate_evaluate(4, replies)

    # Assert
    record = strategy.history.rounds[4]
    assert result[keys.VAL_BPB] == 1.0 and list(record.eval) == ["a"]
    assert record.rejected[0]["source"] == "b" and "finite number" in record.rejected[0]["reason"]
    assert sorted(record.failed, key=lambda f: f["source"]) == [
        {"node": "1", "source": "c", "reason": "no reply within the round timeout"},
        {"node": "3", "source": "d", "reason": "node unavailable"},
    ]


def test_a_reply_for_another_source_is_rejected() -> None:
    grid = LocalGrid(directory_app({1: ["a"]}), [{}], {})
    strategy = mock_strategy(num_server_rounds=1)
    [msg] = strategy.configure_evaluate(
        1, ArrayRecord(strategy.outer.tensors()), ConfigRecord(), grid
    )
    msg.metadata.__dict__["_message_id"] = "m0"
    content = RecordDict(
        {
            keys.METRICS: MetricRecord({keys.VAL_BPB: 1.0}),
            keys.INFO: ConfigRecord({keys.SOURCE: "b"}),
        }
    )
    strategy.aggregate_evaluate(1, [Message(content, reply_to=msg)])
    assert "asked for 'a'" in strategy.history.rounds[1].rejected[0]["reason"]


def test_first_and_last_rounds_evaluate_every_source() -> None:
    grid = LocalGrid(directory_app({1: ["a", "b"], 2: ["c", "d"]}), [{}] * 2, {})
    strategy = mock_strategy(fraction_evaluate=0.25, num_server_rounds=3)
    body = ArrayRecord(strategy.outer.tensors())
    counts = [
        len(list(strategy.configure_evaluate(r, body, ConfigRecord(), grid))) for r in range(4)
    ]
    assert counts == [4, 1, 1, 4]


def test_non_finite_side_metrics_do_not_crash_the_bookkeeping() -> None:
    strategy = mock_strategy()
    good = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.float32)}
    reply = train_reply(strategy, 1, good, 10, "ok")
    reply.content.metric_records[keys.METRICS][keys.EMBEDDING_PARAMS] = float("nan")
    reply.content.metric_records[keys.METRICS][keys.LOCAL_STEPS] = float("inf")
    arrays, _ = strategy.aggregate_train(1, [reply])
    assert arrays is not None and strategy.history.embedding_params["ok"] == 0
