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


def test_blobs_no_array_claims_and_arrays_without_their_blob_are_refused() -> None:
    header, blobs = channel.encode(_content())
    with pytest.raises(channel.ChannelError, match="no array claims"):
        channel.decode(header, [*blobs, b"extra"])
    with pytest.raises(channel.ChannelError, match="has no blob of"):
        channel.decode(header, [blobs[0], blobs[1][:-1]])
    with pytest.raises(channel.ChannelError, match="has no blob of"):
        channel.decode(header, blobs[:1])


def test_received_blobs_are_the_arrays_data_without_a_copy() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        header, blobs = channel.encode(_content())
        channel.send(ours, {"content": header}, blobs)
        got, received = channel.receive(theirs)
    arrays = channel.decode(got["content"], received).array_records["arrays"]
    assert [arrays[k].data for k in ("w", "ids")] == blobs
    assert all(arrays[k].data is b for k, b in zip(("w", "ids"), received, strict=True))
    assert channel.SIZES not in got


def test_blob_sizes_that_do_not_add_up_to_the_body_are_refused() -> None:
    head = b'{"blob-sizes": [3, 4]}'
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(channel.LENGTHS.pack(len(head), 8) + head + b"12345678")
        with pytest.raises(channel.ChannelError, match="do not add up to 8"):
            channel.receive(theirs)


def test_a_receive_within_a_time_gives_up_on_a_silent_peer() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(channel.LENGTHS.pack(2, 0))
        with pytest.raises(OSError):
            channel.receive_within(theirs, 0.2)


@pytest.mark.parametrize(
    "values",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array(3.5),
        np.arange(5, dtype=np.int8),
        np.zeros((0, 4), dtype=np.uint8),
        np.arange(12, dtype=np.int32)[::2],
        np.ones((3, 4), dtype=np.float32).T,
    ],
)
def test_npy_array_is_what_flower_makes_of_the_values(values: np.ndarray) -> None:
    ours, flowers = channel.npy_array(values), Array(values)
    assert (ours.dtype, ours.shape, ours.stype) == (flowers.dtype, flowers.shape, flowers.stype)
    np.testing.assert_array_equal(ours.numpy(), values)
    if values.flags.c_contiguous:
        assert ours.data == flowers.data


def test_the_token_compare_wants_the_exact_secret() -> None:
    assert channel.same_token("s3cret", "s3cret")
    assert not channel.same_token("s3cre", "s3cret")
    assert not channel.same_token(None, "s3cret")
