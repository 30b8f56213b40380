"""DeptStrategy against mock replies: Prepare / Execute / Assert."""

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from dept import keys
from dept.compression import SCALE_SUFFIX, encode
from dept_strategy.discovery import NotEnoughNodes
from dept_strategy.inflight import Target
from dept_strategy.outer import OuterOptimizer
from dept_strategy.screening import Defences
from dept_strategy.strategy import DeptStrategy
from server_app.local_grid import LocalGrid
from tests.helpers import directory_app

BODY = {"a": torch.ones(2, 3), "b": torch.zeros(4)}


@pytest.fixture(autouse=True)
def _as_the_server_app() -> None:
    """Message() reads the sender from the process-wide identity the runtime sets."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0


def _strategy(**kwargs) -> DeptStrategy:
    return DeptStrategy(
        local_steps=5,
        run_id="r",
        **{"outer": OuterOptimizer(BODY, kind="fedavg"), "wait_for_nodes_s": 1.0, **kwargs},
    )


def _instruction(strategy: DeptStrategy, node: int, source: str) -> Message:
    """A message the strategy sent (and tracks) to ``node`` for ``source``."""
    msg = Message(RecordDict({keys.CONFIG: ConfigRecord()}), node, "train")
    msg.metadata.__dict__["_message_id"] = f"m{node}-{source}"
    strategy.in_flight.track(msg, Target(node, source))
    return msg


def _reply(strategy: DeptStrategy, node: int, arrays: dict, weight: float, source: str) -> Message:
    content = RecordDict(
        {
            keys.ARRAYS: ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()}),
            keys.METRICS: MetricRecord(
                {
                    keys.NUM_EXAMPLES: weight,
                    keys.TRAIN_LOSS: 2.0,
                    keys.LOCAL_STEPS: 5,
                    keys.EMBEDDING_PARAMS: 10,
                }
            ),
            keys.INFO: ConfigRecord({keys.SOURCE: source}),
        }
    )
    return Message(content, reply_to=_instruction(strategy, node, source))


def test_aggregates_good_replies_and_drops_bad_ones() -> None:
    # Prepare
    strategy = _strategy()
    d1 = {"a": np.full((2, 3), 1.0, np.float32), "b": np.full(4, 2.0, np.float32)}
    d2 = {"a": np.full((2, 3), -1.0, np.float32), "b": np.full(4, 6.0, np.float32)}
    nan = {**d1, "b": np.array([0, np.nan, 0, 0], np.float32)}
    replies = [
        _reply(strategy, 1, d1, 1, "good-1"),
        _reply(strategy, 2, d2, 3, "good-2"),
        _reply(strategy, 3, {"a": d1["a"]}, 1, "missing-key"),
        _reply(strategy, 4, {**d1, "b": np.zeros(5, np.float32)}, 1, "wrong-shape"),
        _reply(strategy, 5, nan, 1, "nan"),
        _reply(strategy, 6, d1, 0, "zero-weight"),
        _reply(strategy, 7, {k: v.astype(np.float64) for k, v in d1.items()}, 1, "float64"),
        Message(
            Error(code=2, reason="Traceback...\nValueError: no data"),
            reply_to=_instruction(strategy, 8, "broken"),
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


def test_no_usable_reply_leaves_the_body_unchanged() -> None:
    strategy = _strategy()
    bad = _reply(strategy, 1, {"a": np.zeros((2, 3), np.float32)}, 1, "x")
    assert strategy.aggregate_train(1, [bad]) == (None, None)
    assert torch.equal(strategy.outer.tensors()["a"], BODY["a"])


def test_fewer_usable_replies_than_min_train_replies_leave_the_body_unchanged() -> None:
    strategy = _strategy(min_train_replies=3)
    good = {"a": np.ones((2, 3), np.float32), "b": np.ones(4, np.float32)}
    replies = [_reply(strategy, n, good, 1, f"s{n}") for n in (1, 2)]  # the third node is gone
    assert strategy.aggregate_train(1, replies) == (None, None)
    assert torch.equal(strategy.outer.tensors()["a"], BODY["a"])
    replies = [_reply(strategy, n, good, 1, f"s{n}") for n in (1, 2, 3)]
    arrays, _ = strategy.aggregate_train(2, replies)
    assert np.allclose(arrays["a"].numpy(), 0.0)


def test_configure_train_samples_sources_and_sends_only_the_body() -> None:
    # Prepare: node 1 serves two sources, node 2 one, node 3 none, node 4 is broken
    grid = LocalGrid(directory_app({1: ["a", "c"], 2: ["b"], 3: []}), [{}] * 4, {})
    strategy = _strategy(fraction_train=0.67, min_train_nodes=1)
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
    everyone = _strategy(min_train_nodes=3, fraction_train=0.1)
    assert len(list(everyone.configure_train(1, body, ConfigRecord(), grid))) == 3


def test_waiting_for_nodes_is_bounded() -> None:
    grid = LocalGrid(directory_app({1: ["a"], 2: ["b"]}), [{}] * 2, {})
    with pytest.raises(NotEnoughNodes, match=r"for 5 node\(s\) .* saw 2 node"):
        _strategy(min_available_nodes=5).wait_for_sources(grid)
    assert _strategy(min_available_nodes=2).wait_for_sources(grid) == {"a": 1, "b": 2}


def test_per_source_evaluation_table() -> None:
    strategy = _strategy()
    replies = []
    for node, (source, bpb) in enumerate([("de", 1.5), ("fr", 2.5)], start=1):
        content = RecordDict(
            {
                keys.METRICS: MetricRecord({keys.VAL_BPB: bpb, keys.VAL_LOSS: 1.0}),
                keys.INFO: ConfigRecord({keys.SOURCE: source}),
            }
        )
        replies.append(Message(content, reply_to=_instruction(strategy, node, source)))
    result = strategy.aggregate_evaluate(2, replies)
    assert math.isclose(result[keys.VAL_BPB], 2.0)
    assert strategy.history.rounds[2].eval["fr"][keys.VAL_BPB] == 2.5


def test_unreadable_arrays_and_inflated_weights_are_rejected_not_fatal() -> None:
    strategy = _strategy(max_tokens_per_round=1000)
    good = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.float32)}
    corrupt = _reply(strategy, 1, good, 10, "corrupt")
    corrupt.content.array_records[keys.ARRAYS]["b"].data = b"not an npy payload"
    huge = _reply(strategy, 2, {**good, "b": np.full(4, 1e30, np.float32)}, 1e20, "huge")
    arrays, _ = strategy.aggregate_train(1, [corrupt, huge, _reply(strategy, 3, good, 10, "ok")])
    reasons = {r["source"]: r["reason"] for r in strategy.history.rounds[1].rejected}
    assert "cannot be read" in reasons["corrupt"] and "num-examples" in reasons["huge"]
    assert np.isfinite(arrays["b"].numpy()).all()


def test_replies_are_credited_by_message_and_silence_is_reported() -> None:
    # Prepare: node 1 serves a and c, node 2 serves b, node 3 serves d
    grid = LocalGrid(directory_app({1: ["a", "c"], 2: ["b"], 3: ["d"]}), [{}] * 3, {})
    strategy = _strategy(num_rounds=4)
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
    strategy = _strategy(num_rounds=1)
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
    strategy = _strategy(fraction_evaluate=0.25, num_rounds=3)
    body = ArrayRecord(strategy.outer.tensors())
    counts = [
        len(list(strategy.configure_evaluate(r, body, ConfigRecord(), grid))) for r in range(4)
    ]
    assert counts == [4, 1, 1, 4]


def test_non_finite_side_metrics_do_not_crash_the_bookkeeping() -> None:
    strategy = _strategy()
    good = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.float32)}
    reply = _reply(strategy, 1, good, 10, "ok")
    reply.content.metric_records[keys.METRICS][keys.EMBEDDING_PARAMS] = float("nan")
    reply.content.metric_records[keys.METRICS][keys.LOCAL_STEPS] = float("inf")
    arrays, _ = strategy.aggregate_train(1, [reply])
    assert arrays is not None and strategy.history.embedding_params["ok"] == 0


PHI = torch.arange(10, dtype=torch.float32).reshape(5, 2)


def _shared_strategy(trim: bool) -> DeptStrategy:
    return _strategy(
        outer=OuterOptimizer({**BODY, "input": PHI}, kind="fedavg"),
        embedding_names=("input",),
        trim=trim,
    )


def _trim_reply(
    strategy: DeptStrategy, node: int, rows: list[int], value: float, w: float
) -> Message:
    body = {"a": np.full((2, 3), value, np.float32), "b": np.full(4, value, np.float32)}
    phi = np.full((len(rows), 2), value, np.float32)
    reply = _reply(strategy, node, {**body, "input": phi}, w, f"s{node}")
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
    phi = arrays["input"].numpy()
    assert np.allclose(phi[0], PHI[0] - 1.0), "one holder: its own update"
    assert np.allclose(phi[1], PHI[1] - (1 * 1.0 + 3 * 3.0) / 4), "two holders: weighted mean"
    assert np.allclose(phi[2], PHI[2] - 3.0)
    assert np.array_equal(phi[3:], PHI[3:].numpy()), "no holder: unchanged"
    assert np.allclose(arrays["a"].numpy(), 1.0 - (1 * 1.0 + 3 * 3.0) / 4)
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
        _reply(strategy, i + 1, {k: full[k].numpy() - c[k] for k in full}, w, f"s{i + 1}")
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


def test_compressed_replies_are_decoded_and_malformed_ones_rejected() -> None:
    # Prepare: Δ = 1 for "a", 2 for "b", sent as int8 codes with their block scales
    strategy = _strategy(compression="int8")
    delta = {"a": torch.full((2, 3), 1.0), "b": torch.full((4,), 2.0)}
    good = encode(delta, "int8")
    scale = "a" + SCALE_SUFFIX
    replies = [
        _reply(strategy, 1, good, 1, "good"),
        _reply(strategy, 2, {k: v for k, v in good.items() if k != scale}, 1, "no-scale"),
        _reply(strategy, 3, {**good, "a": good["a"].float()}, 1, "float-codes"),
        _reply(strategy, 4, {**good, scale: torch.tensor([float("nan")])}, 1, "nan-scale"),
        _reply(strategy, 5, {**good, scale: torch.ones(2)}, 1, "two-scales"),
        _reply(strategy, 6, delta, 1, "uncompressed"),
    ]
    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)
    # Assert
    assert arrays is not None
    assert np.allclose(arrays["a"].numpy(), BODY["a"].numpy() - 1.0)
    assert np.allclose(arrays["b"].numpy(), BODY["b"].numpy() - 2.0)
    record = strategy.history.rounds[1]
    assert list(record.train) == ["good"]
    reasons = {r["source"]: r["reason"] for r in record.rejected}
    assert "missing ['a@scale']" in reasons["no-scale"]
    assert "'a' has dtype float32, expected int8" in reasons["float-codes"]
    assert "finite scales" in reasons["nan-scale"]
    assert "'a@scale' has shape (2,), expected (1,)" in reasons["two-scales"]
    assert "missing ['a@scale', 'b@scale']" in reasons["uncompressed"]
    assert record.train["good"]["bytes_up"] == replies[0].content[keys.ARRAYS].count_bytes()
    with pytest.raises(ValueError, match="compression"):
        _strategy(compression="int4")


def _honest(value: float) -> dict[str, np.ndarray]:
    return {"a": np.full((2, 3), value, np.float32), "b": np.full(4, -value, np.float32)}


@pytest.mark.parametrize("action", ["clip", "reject"])
@pytest.mark.parametrize("scale", [1e3, 1e6, None])  # None: values near the float32 limit
def test_a_poisoned_update_is_clipped_or_refused_alone_and_named(
    scale: float | None, action: str
) -> None:
    # Prepare: three honest sources and one whose update is scaled (or ~3e38)
    strategy = _strategy(defences=Defences(outlier_action=action))
    poison = _honest(1e-3 * scale) if scale else _honest(3.3e38)
    replies = [_reply(strategy, n, _honest(v), 100, f"s{n}") for n, v in ((1, 1e-3), (2, 2e-3))]
    replies += [_reply(strategy, 3, poison, 100, "poison")]
    replies += [_reply(strategy, 4, _honest(3e-3), 100, "s4")]
    # Execute
    arrays, metrics = strategy.aggregate_train(1, replies)
    # Assert: clipped to the median (2e-3) or dropped, the mean is the honest one either way
    assert arrays is not None
    assert np.allclose(arrays["a"].numpy(), 1.0 - 2e-3) and np.allclose(arrays["b"].numpy(), 2e-3)
    record = strategy.history.rounds[1]
    named = record.clipped if action == "clip" else record.rejected
    assert [r["source"] for r in named] == ["poison"] and "the round's median" in named[0]["reason"]
    credited = 400 if action == "clip" else 300
    assert metrics[keys.NUM_EXAMPLES] == credited
    assert strategy.history.tokens_trained("poison") == credited - 300
    assert [(p["kind"], p["source"]) for p in strategy.history.problems()] == [
        ("clipped" if action == "clip" else "rejected", "poison")
    ]


def test_an_update_beyond_local_trainings_reach_is_refused_even_alone() -> None:
    strategy = _strategy(
        defences=Defences(reach=lambda step, biggest: 0.01, outlier_action="reject")
    )
    replies = [_reply(strategy, 1, _honest(0.5), 100, "alone")]
    assert strategy.aggregate_train(1, replies) == (None, None)
    assert (
        "beyond what this round's local training"
        in strategy.history.rounds[1].rejected[0]["reason"]
    )
    ok = [_reply(strategy, 1, _honest(0.005), 100, "alone")]
    assert strategy.aggregate_train(2, ok)[0] is not None
    clipping = _strategy(defences=Defences(reach=lambda step, biggest: 0.01))
    arrays, _ = clipping.aggregate_train(1, [_reply(clipping, 1, _honest(0.5), 100, "alone")])
    assert np.allclose(arrays["a"].numpy(), 1.0 - 0.01), "scaled until it is within reach"


def test_a_median_rule_is_not_moved_by_a_sign_flipped_source_within_bounds() -> None:
    strategy = _strategy(defences=Defences(aggregation="median"))
    values = (1e-3, 1.1e-3, 0.9e-3, 1e-3, -5e-3)  # the last one pulls the wrong way, 5x
    replies = [_reply(strategy, n, _honest(v), 100, f"s{n}") for n, v in enumerate(values, 1)]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert not strategy.history.rounds[1].rejected, "within the size checks"
    assert np.allclose(arrays["a"].numpy(), 1.0 - 1e-3)


def test_duplicate_and_unsolicited_replies_are_ignored_and_recorded() -> None:
    strategy = _strategy()
    first = _reply(strategy, 1, _honest(1e-3), 100, "s1")
    again = _reply(strategy, 1, _honest(1e-3), 100, "s1")  # answers the same message id
    stranger = Message(first.content, reply_to=Message(RecordDict(), 9, "train"))
    strategy.aggregate_train(1, [first, again, stranger])
    record = strategy.history.rounds[1]
    assert list(record.train) == ["s1"] and not record.rejected
    reasons = [i["reason"] for i in record.ignored]
    assert reasons[0].startswith("duplicate") and reasons[1].startswith("unsolicited")


@pytest.mark.parametrize(
    ("metrics", "why"),
    [
        ({keys.VAL_BPB: -1e9}, "'val-bpb' is -1e+09; it cannot be below 0"),
        ({keys.VAL_BPB: 1.0, keys.VAL_PPL: 0.5}, "'val-ppl' is 0.5; it cannot be below 1"),
        ({keys.VAL_BPB: 1.0, keys.VAL_LOSS: float("inf")}, "'val-loss' must be a finite number"),
    ],
)
def test_evaluation_replies_out_of_range_are_rejected(metrics: dict, why: str) -> None:
    strategy = _strategy()
    content = RecordDict(
        {keys.METRICS: MetricRecord(metrics), keys.INFO: ConfigRecord({keys.SOURCE: "de"})}
    )
    strategy.aggregate_evaluate(1, [Message(content, reply_to=_instruction(strategy, 1, "de"))])
    record = strategy.history.rounds[1]
    assert not record.eval and why in record.rejected[0]["reason"]


def test_the_last_trained_round_goes_out_and_state_events_come_back() -> None:
    grid = LocalGrid(directory_app({1: ["a"]}), [{}], {})
    strategy = _strategy(num_rounds=3)
    body = ArrayRecord(strategy.outer.tensors())
    [first] = strategy.configure_train(1, body, ConfigRecord(), grid)
    assert first.content.config_records[keys.CONFIG][keys.LAST_TRAINED] == -1
    first.metadata.__dict__["_message_id"] = "t1"
    reply = _reply(strategy, 1, _honest(1e-3), 100, "a")
    reply.metadata.__dict__["_reply_to_message_id"] = "t1"
    reply.content.config_records[keys.INFO][keys.STATE_EVENT] = "fresh embeddings: state lost"
    strategy.aggregate_train(1, [reply])
    [second] = strategy.configure_train(2, body, ConfigRecord(), grid)
    assert second.content.config_records[keys.CONFIG][keys.LAST_TRAINED] == 1
    [event] = strategy.history.rounds[1].state_events
    assert event == {"node": "1", "source": "a", "event": "fresh embeddings: state lost"}
