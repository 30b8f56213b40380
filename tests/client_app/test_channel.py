"""The warm worker's wire: records cross whole, nothing but JSON and array bytes."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from client_app import channel


def _content() -> RecordDict:
    arrays = ArrayRecord(
        {"w": Array(np.arange(6, dtype=np.float32).reshape(2, 3)), "ids": Array(np.arange(4))}
    )
    return RecordDict(
        {
            "arrays": arrays,
            "metrics": MetricRecord({"num-examples": 7, "loss": float("nan")}),
            "config": ConfigRecord({"sources": ["a", "b"], "round": 2, "source": "x"}),
        }
    )


def test_a_record_dict_crosses_a_socket_whole() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        header, blobs = channel.encode(_content())
        channel.send(ours, {"content": header}, blobs)
        got, body = channel.receive(theirs)
    back = channel.decode(got["content"], body)

    arrays = back.array_records["arrays"]
    np.testing.assert_array_equal(arrays["w"].numpy(), np.arange(6).reshape(2, 3))
    assert arrays["w"].numpy().dtype == np.float32
    np.testing.assert_array_equal(arrays["ids"].numpy(), np.arange(4))
    assert back.metric_records["metrics"]["num-examples"] == 7
    assert np.isnan(back.metric_records["metrics"]["loss"])
    assert back.config_records["config"]["sources"] == ["a", "b"]


def test_a_peer_that_hangs_up_mid_frame_is_a_channel_error() -> None:
    ours, theirs = socket.socketpair()
    with theirs:
        with ours:
            ours.sendall(channel.LENGTHS.pack(10, 0) + b'{"a"')
        with pytest.raises(channel.ChannelError, match="closed the connection"):
            channel.receive(theirs)


def test_array_bytes_no_array_claims_are_refused() -> None:
    header, blobs = channel.encode(_content())
    with pytest.raises(channel.ChannelError, match="no array claims"):
        channel.decode(header, memoryview(b"".join(blobs) + b"extra"))


def test_the_token_compare_wants_the_exact_secret() -> None:
    assert channel.same_token("s3cret", "s3cret")
    assert not channel.same_token("s3cre", "s3cret")
    assert not channel.same_token(None, "s3cret")
