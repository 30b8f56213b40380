"""A deployment message's way through a node, read back from the logs of a loopback run.

With ``FLWR_LOG_LEVEL=DEBUG`` every Flower process stamps its log lines with the time, and
the project's lines, routed through Flower's handler, are stamped alike; all run on one
machine, so one clock orders them. A node handles one message at a time, so its k-th
``Receiving`` (SuperNode), k-th ``flwr-clientapp`` start, k-th arrival and answer (the
ClientApp, :mod:`client_app.app`) and k-th ``Sending`` belong to the same message; the
j-th ``local steps`` line of the node (:func:`dept.train.local.train_local`, in the ClientApp or
its warm worker) to its j-th train message. The ServerApp's pushes are the SuperLink's
``Runtime.PushMessages`` calls (only the ServerApp talks to its Runtime API).

Under heavy load Flower may start more than one ``flwr-clientapp`` for a message: one that
is slow to claim its task finds its token expired (401) and stops, and the SuperExec starts
another. The message's process is the one that arrived (its start is the arrival time less
the age it logs); the others count in ``processes`` and their time in ``spawn``.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STAMPED = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR)\s+(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\s*:\s*(.*)$"
)
PUSH = re.compile(r"^Runtime\.PushMessages$")
RECEIVING = re.compile(r"^Receiving: (?P<kind>\w+) message")
SENDING = re.compile(r"^Sending: (?P<kind>\w+) message")
SENT = re.compile(r"^Sent successfully")
STARTED = re.compile(r"^Start `flwr-clientapp` process")
LOADING = re.compile(r"^\[flwr-clientapp\] Start `ClientApp` Loading")
ARRIVAL = re.compile(r"^\S*: (?P<kind>\w+) in hand (?P<age>[\d.]+) s after its process started")
STEPS = re.compile(r"^round \d+ \S+: \d+ local steps from global step \d+")
ANSWER = re.compile(
    r"^\S*: (?P<kind>\w+) answered (?P<total>[\d.]+) s after arrival, "
    r"(?P<training>[\d.]+) s of it training"
)
ROUND_START = re.compile(r"^round (?P<round>\d+): training")
ROUND_DONE = re.compile(r"^round (?P<round>\d+)/\d+ done")
# A message's way, in order; each segment runs from the previous mark to its own. "ours":
# the project's code (the thin app's import, then the work); the rest is Flower's.
SEGMENTS = (
    ("poll", "pushed by the ServerApp until the SuperNode pulls it (its 3 s sleep)"),
    ("spawn", "pulled until a flwr-clientapp process starts (SuperExec's 1 s poll, fork)"),
    ("flwr import", "process start until Flower's first line (interpreter, flwr imports)"),
    ("task+FAB", "task input pulled, the app bundle unpacked and checked"),
    ("app import", "ours: the thin client_app.app imported, the handler called"),
    ("(a) to step 1", "ours: handler to the first local step (train; evaluate: to reply)"),
    ("steps", "the local steps (train only)"),
    ("(b) to reply", "ours: last local step to the handler's reply (train only)"),
    ("pickup", "the reply pushed to the SuperNode and picked up (its 0.5 s poll)"),
    ("upload", "the SuperNode sends the reply to the SuperLink"),
)
OURS = ("app import", "(a) to step 1", "(b) to reply")


class TimelineError(ValueError):
    """The logs do not tell a whole message's way (a failed message, a missing line)."""


@dataclass(frozen=True)
class Line:
    time: float  # seconds since the epoch, this machine's clock
    text: str


def lines(log: str) -> list[Line]:
    """The time-stamped lines of ``log`` (colours stripped); unstamped ones are dropped."""
    found = []
    for raw in log.splitlines():
        match = STAMPED.match(ANSI.sub("", raw).strip())
        if match:
            when = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append(Line(when, match[2].strip()))
    return found


def _matches(found: list[Line], pattern: re.Pattern[str]) -> list[tuple[Line, re.Match[str]]]:
    return [(line, m) for line in found if (m := pattern.match(line.text))]


def _last(times: list[float], t: float) -> float:
    """The latest of ``times`` at or before ``t`` (``t`` itself if none is)."""
    i = bisect_right(times, t)
    return times[i - 1] if i else t


def _after(found: list[Line], pattern: re.Pattern[str], t: float) -> float:
    """The time of the first line matching ``pattern`` at or after ``t``."""
    for line in found:
        if line.time >= t and pattern.match(line.text):
            return line.time
    raise TimelineError(f"no {pattern.pattern!r} line after {t}")


def messages(superlink: str, supernode: str, clientapp: str) -> list[dict[str, float | str]]:
    """A row per message one node handled: its kind, then each of :data:`SEGMENTS`'
    seconds, and ``total`` (ServerApp push to reply uploaded)."""
    pushes = [line.time for line, _ in _matches(lines(superlink), PUSH)]
    node, app = lines(supernode), lines(clientapp)
    received = _matches(node, RECEIVING)
    sending = _matches(node, SENDING)
    starts = [line.time for line, _ in _matches(app, STARTED)]
    loads = [line.time for line, _ in _matches(app, LOADING)]
    arrivals = _matches(app, ARRIVAL)
    answers = _matches(app, ANSWER)
    steps = iter(line.time for line, _ in _matches(app, STEPS))
    counts = {len(received), len(arrivals), len(answers), len(sending)}
    if len(counts) != 1:
        raise TimelineError(
            f"a message's lines are missing: {len(received)} received, {len(arrivals)} "
            f"arrivals, {len(answers)} answers, {len(sending)} sent"
        )
    rows = []
    for k, (receipt, kind) in enumerate(received):
        arrival, arrived = arrivals[k]
        answer, answered = answers[k]
        training = float(answered["training"])
        first_step = next(steps) if kind["kind"] == "train" else answer.time - training
        marks = [
            _last(pushes, receipt.time),
            receipt.time,
            arrival.time - float(arrived["age"]),  # the process's start
            _last(starts, arrival.time),
            _last(loads, arrival.time),
            arrival.time,
            first_step,
            first_step + training,
            answer.time,
            sending[k][0].time,
            _after(node, SENT, sending[k][0].time),
        ]
        spawned = [t for t in starts if receipt.time <= t <= arrival.time]
        row: dict[str, float | str] = {"kind": kind["kind"], "index": k, "processes": len(spawned)}
        for (name, _), (begin, end) in zip(SEGMENTS, pairwise(marks), strict=True):
            row[name] = round(end - begin, 3)
        row["total"] = round(marks[-1] - marks[0], 3)
        row["ours"] = round(sum(float(row[name]) for name in OURS), 3)
        row["flower"] = round(float(row["total"]) - float(row["ours"]) - training, 3)
        rows.append(row)
    return rows


def round_walls(server: str) -> list[float]:
    """Seconds from each round's training push to its end, from the ServerApp's log."""
    found = lines(server)
    starts = {m["round"]: line.time for line, m in _matches(found, ROUND_START)}
    return [
        round(line.time - starts[m["round"]], 3)
        for line, m in _matches(found, ROUND_DONE)
        if m["round"] in starts
    ]
