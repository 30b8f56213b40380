"""benchmarks.overhead.message_timeline: a message's way read back from stamped logs, segment by
segment, Flower's retried processes included."""

from __future__ import annotations

import pytest

from benchmarks.overhead.message_timeline import TimelineError, messages, round_walls

DAY = "2026-12-02 01:00"


def stamp(second: float, text: str, level: str = "INFO") -> str:
    """A Flower console line as ``FLWR_LOG_LEVEL=DEBUG`` prints it, colours and all."""
    whole, frac = divmod(round(second * 1000), 1000)
    return f"\x1b[92m{level} {DAY}:{whole:02d},{frac:03d}\x1b[0m:      {text}"


SUPERLINK = "\n".join(
    [
        stamp(0.0, "Runtime.PushMessages", "DEBUG"),
        "INFO:     127.0.0.1:1 - POST /v1/runtime/push-messages HTTP/1.1 200 OK",
        stamp(10.0, "Runtime.PushMessages", "DEBUG"),
    ]
)
SUPERNODE = "\n".join(
    [
        stamp(1.0, "Receiving: query message (ID: a)"),
        stamp(4.0, "Sending: query message (ID: b)"),
        stamp(4.5, "Sent successfully"),
        stamp(12.0, "Receiving: train message (ID: c)"),
        stamp(20.0, "Sending: train message (ID: d)"),
        stamp(21.0, "Sent successfully"),
    ]
)
CLIENTAPP = "\n".join(
    [
        stamp(2.0, "Start `flwr-clientapp` process"),
        stamp(2.5, "[flwr-clientapp] Start `ClientApp` Loading.", "DEBUG"),
        stamp(2.6, ": query in hand 1.100 s after its process started"),
        stamp(3.5, ": query answered 2.000 s after arrival, 0.000 s of it training"),
        stamp(13.0, "Start `flwr-clientapp` process"),  # its token expired: retried
        stamp(14.0, "Start `flwr-clientapp` process"),
        stamp(15.0, "[flwr-clientapp] Start `ClientApp` Loading.", "DEBUG"),
        stamp(15.5, "greek: train in hand 2.000 s after its process started"),
        stamp(16.0, "round 1 greek: 2 local steps from global step 0"),
        stamp(18.5, "greek: train answered 5.000 s after arrival, 2.000 s of it training"),
    ]
)


def test_each_segment_runs_from_the_previous_mark_to_its_own() -> None:
    query, train = messages(SUPERLINK, SUPERNODE, CLIENTAPP)

    assert query["kind"] == "query" and query["poll"] == 1.0 and query["total"] == 4.5
    assert query["(a) to step 1"] == pytest.approx(0.9)  # a query's work is all of it
    expected = {
        "processes": 2,
        "poll": 2.0,  # pushed at 10, pulled at 12
        "spawn": 1.5,  # the arrived process started at 15.5 - 2.0
        "flwr import": 0.5,
        "task+FAB": 1.0,
        "app import": 0.5,
        "(a) to step 1": 0.5,
        "steps": 2.0,
        "(b) to reply": 0.5,
        "pickup": 1.5,
        "upload": 1.0,
        "total": 11.0,
        "ours": 1.5,
        "flower": 7.5,
    }
    assert {k: train[k] for k in expected} == pytest.approx(expected)


def test_a_message_without_its_answer_is_refused() -> None:
    unanswered = CLIENTAPP.replace("train answered", "train gave up")
    with pytest.raises(TimelineError, match="1 answers"):
        messages(SUPERLINK, SUPERNODE, unanswered)


def test_a_round_runs_from_its_training_push_to_its_end() -> None:
    server = "\n".join(
        [
            stamp(5.0, "round 1: training greek, latin"),
            stamp(35.5, "round 1/2 done: avg val bpb 3.3"),
        ]
    )
    assert round_walls(server) == [30.5]
