"""DeptStrategy refusing what it must: malformed, oversized, poisoned, duplicate replies."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from dept.wire import keys
from dept.wire.compression import SCALE_SUFFIX, encode
from dept_strategy.screening import Defences
from server_app.local_grid import LocalGrid
from tests.dept_strategy.mock_replies import BODY, instruction_to, mock_strategy, train_reply
from tests.helpers import directory_app


def test_compressed_replies_are_decoded_and_malformed_ones_rejected() -> None:
    # Prepare: Δ = 1 for "a", 2 for "b", sent as int8 codes with their block scales
    strategy = mock_strategy(compression="int8")
    delta = {"a": torch.full((2, 3), 1.0), "b": torch.full((4,), 2.0)}
    good = encode(delta, "int8")
    scale = "a" + SCALE_SUFFIX
    replies = [
        train_reply(strategy, 1, good, 1, "good"),
        train_reply(strategy, 2, {k: v for k, v in good.items() if k != scale}, 1, "no-scale"),
        train_reply(strategy, 3, {**good, "a": good["a"].float()}, 1, "float-codes"),
        train_reply(strategy, 4, {**good, scale: torch.tensor([float("nan")])}, 1, "nan-scale"),
        train_reply(strategy, 5, {**good, scale: torch.ones(2)}, 1, "two-scales"),
        train_reply(strategy, 6, delta, 1, "uncompressed"),
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
        mock_strategy(compression="int3")


def _honest(value: float) -> dict[str, np.ndarray]:
    return {"a": np.full((2, 3), value, np.float32), "b": np.full(4, -value, np.float32)}


@pytest.mark.parametrize("action", ["clip", "reject"])
@pytest.mark.parametrize("scale", [1e3, 1e6, None])  # None: values near the float32 limit
def test_a_poisoned_update_is_clipped_or_refused_alone_and_named(
    scale: float | None, action: str
) -> None:
    # Prepare: three honest sources and one whose update is scaled (or ~3e38)
    strategy = mock_strategy(defences=Defences(outlier_action=action))
    poison = _honest(1e-3 * scale) if scale else _honest(3.3e38)
    replies = [
        train_reply(strategy, n, _honest(v), 100, f"s{n}") for n, v in ((1, 1e-3), (2, 2e-3))
    ]
    replies += [train_reply(strategy, 3, poison, 100, "poison")]
    replies += [train_reply(strategy, 4, _honest(3e-3), 100, "s4")]
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
    strategy = mock_strategy(
        defences=Defences(reach=lambda step, biggest: 0.01, outlier_action="reject")
    )
    replies = [train_reply(strategy, 1, _honest(0.5), 100, "alone")]
    assert strategy.aggregate_train(1, replies) == (None, None)
    assert (
        "beyond what this round's local training"
        in strategy.history.rounds[1].rejected[0]["reason"]
    )
    ok = [train_reply(strategy, 1, _honest(0.005), 100, "alone")]
    assert strategy.aggregate_train(2, ok)[0] is not None
    clipping = mock_strategy(defences=Defences(reach=lambda step, biggest: 0.01))
    arrays, _ = clipping.aggregate_train(1, [train_reply(clipping, 1, _honest(0.5), 100, "alone")])
    assert np.allclose(arrays["a"].numpy(), 1.0 - 0.01), "scaled until it is within reach"


def test_a_median_rule_is_not_moved_by_a_sign_flipped_source_within_bounds() -> None:
    strategy = mock_strategy(defences=Defences(aggregation="median"))
    values = (1e-3, 1.1e-3, 0.9e-3, 1e-3, -5e-3)  # the last one pulls the wrong way, 5x
    replies = [train_reply(strategy, n, _honest(v), 100, f"s{n}") for n, v in enumerate(values, 1)]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert not strategy.history.rounds[1].rejected, "within the size checks"
    assert np.allclose(arrays["a"].numpy(), 1.0 - 1e-3)


def test_duplicate_and_unsolicited_replies_are_ignored_and_recorded() -> None:
    strategy = mock_strategy()
    first = train_reply(strategy, 1, _honest(1e-3), 100, "s1")
    again = train_reply(strategy, 1, _honest(1e-3), 100, "s1")  # answers the same message id
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
    strategy = mock_strategy()
    content = RecordDict(
        {keys.METRICS: MetricRecord(metrics), keys.INFO: ConfigRecord({keys.SOURCE: "de"})}
    )
    strategy.aggregate_evaluate(1, [Message(content, reply_to=instruction_to(strategy, 1, "de"))])
    record = strategy.history.rounds[1]
    assert not record.eval and why in record.rejected[0]["reason"]


def test_the_last_trained_round_goes_out_and_state_events_come_back() -> None:
    grid = LocalGrid(directory_app({1: ["a"]}), [{}], {})
    strategy = mock_strategy(num_server_rounds=3)
    body = ArrayRecord(strategy.outer.tensors())
    [first] = strategy.configure_train(1, body, ConfigRecord(), grid)
    assert first.content.config_records[keys.CONFIG][keys.LAST_TRAINED] == -1
    first.metadata.__dict__["_message_id"] = "t1"
    reply = train_reply(strategy, 1, _honest(1e-3), 100, "a")
    reply.metadata.__dict__["_reply_to_message_id"] = "t1"
    reply.content.config_records[keys.INFO][keys.STATE_EVENT] = "fresh embeddings: state lost"
    strategy.aggregate_train(1, [reply])
    [second] = strategy.configure_train(2, body, ConfigRecord(), grid)
    assert second.content.config_records[keys.CONFIG][keys.LAST_TRAINED] == 1
    [event] = strategy.history.rounds[1].state_events
    assert event == {"node": "1", "source": "a", "event": "fresh embeddings: state lost"}
