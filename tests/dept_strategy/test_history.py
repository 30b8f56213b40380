"""RunHistory: every number of a source per round, and what never counted, with why."""

from __future__ import annotations

import math

from dept.wire import keys
from dept_strategy.history import RunHistory


def _history() -> RunHistory:
    history = RunHistory(body_params=10, local_steps=5)
    train = {
        keys.NUM_EXAMPLES: 25600.0,  # MetricRecord numbers arrive as floats
        keys.TRAIN_LOSS: 2.5,
        keys.TOKENS_PER_S: 1000.0,
        keys.LOCAL_STEPS: 5.0,
        keys.BYTES_RECEIVED: 40.0,
    }
    history.record_train(1, "a", train, bytes_up=40)
    history.record_eval(1, "a", {keys.VAL_BPB: 1.5, keys.VAL_TOKENS: 512.0, keys.VAL_BYTES: 900.0})
    history.failed(0, 2, "source b: OSError: no corpus", source="b")
    history.failed(1, 2, "Traceback ...\nsource b: ValueError: NaN loss", source="b")
    history.rejected(1, 3, "update holds NaN", source="c")
    history.record_eval(1, "c", {keys.VAL_BPB: 2.0})
    history.failed(0, 4, "did not say which sources it serves: no answer within 5 s")
    history.failed(1, 5, "source lost: ConfigError: no data")
    return history


def test_a_source_row_has_every_number_and_counts_as_integers() -> None:
    row = _history().round_json(1)["sources"]["a"]

    assert row["tokens"] == 25600 and isinstance(row["tokens"], int)
    assert all(
        isinstance(row[k], int)
        for k in ("tokens", "local_steps", "bytes_up", "bytes_down", "val_tokens", "val_bytes")
    )
    assert row["tokens_per_s"] == 1000.0 and row["bytes_up"] == row["bytes_down"] == 40
    assert row["val_bpb"] == 1.5 and math.isnan(row["train_final_loss"])


def test_sources_that_never_counted_are_named_with_their_reasons() -> None:
    history = _history()

    assert history.sources() == ["a", "c"], "only sources with a result that counted"
    assert history.never_succeeded() == ["b"]
    assert history.failures("b") == [
        "source b: OSError: no corpus",
        "source b: ValueError: NaN loss",
    ]
    assert history.failures("c") == ["update holds NaN"] and history.failures("a") == []
    assert history.unserved_nodes() == {"5": "source lost: ConfigError: no data"}, (
        "node 4 failed only before the last round; node 5 in it too"
    )


def test_the_mean_bpb_does_not_depend_on_the_order_replies_arrived_in() -> None:
    # Prepare: three values whose float sum depends on its order
    values = {"a": 0.1, "b": 0.2, "c": 0.3}
    assert (0.1 + 0.2) + 0.3 != (0.3 + 0.2) + 0.1
    histories = [RunHistory(body_params=10, local_steps=5) for _ in range(2)]
    # Execute: the same evaluations, arriving in two orders
    for history, order in zip(histories, ("abc", "cba"), strict=True):
        for source in order:
            history.record_eval(1, source, {keys.VAL_BPB: values[source]})
    # Assert
    means = [h.round_json(1)["avg_val_bpb"] for h in histories]
    assert means[0] == means[1] == ((0.1 + 0.2) + 0.3) / 3
