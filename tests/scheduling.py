"""How the suite spreads over pytest-xdist's workers: the longest tests first, one at a time.

Most of the slow tier's time is spent waiting (a heartbeat window, a round timeout, a
container build), and its longest tests alone take minutes. xdist's own ``load`` scheduler
hands out tests in collection order in large chunks, so two long tests could queue behind
each other on one worker while the others sit idle at the end. :class:`LongestFirst` sends
the tests in order of their expected time (``tests/durations.json``, measured; a test not
listed there is taken as short), round-robin to begin with, then one
more to whichever worker finishes: the long tests start at once, on different workers, and
the short ones fill in around them.

Each worker also gets its own part of the port span free ports are taken from
(:func:`server_app.local_runtime.free_port`), so two workers' deployments never pick the
same port; the variable is inherited by every process a test starts.

``python -m tests.scheduling JUNIT.xml`` writes ``tests/durations.json`` from a run's
``--junitxml`` report.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from server_app.local_runtime import PORT_SPAN, PORT_SPAN_VARIABLE

DURATIONS = Path(__file__).with_name("durations.json")
LISTED_FROM_S = 1.0  # shorter tests are not listed: their order hardly matters
UNLISTED_S = 0.1


def worker_port_span(worker: str, count: int) -> str:
    """Worker ``gwN``'s share of :data:`PORT_SPAN`, as ``LOW-HIGH``."""
    index = int(worker.removeprefix("gw"))
    width = len(PORT_SPAN) // max(count, 1)
    low = PORT_SPAN.start + index * width
    return f"{low}-{low + width - 1}"


def auto_workers() -> int:
    """One worker more than the cores: the slow tests spend much of their time waiting on
    Flower's heartbeats and timeouts, a core's worth on two cores (measured: the whole
    suite took 982 s on 2 cores with 3 workers; 4 took 1,066 s and failed a timing check)."""
    return len(os.sched_getaffinity(0)) + 1


def give_worker_its_ports() -> None:
    """In an xdist worker: set :data:`PORT_SPAN_VARIABLE` to the worker's share."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        os.environ[PORT_SPAN_VARIABLE] = worker_port_span(worker, count)


def load_durations() -> dict[str, float]:
    return json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}


def make_scheduler(config: Any, log: Any) -> Any:
    """A :class:`LongestFirst` (built here: xdist is imported only where it runs)."""
    from xdist.scheduler import LoadScheduling

    class LongestFirst(LoadScheduling):
        """xdist's ``load`` scheduling, with the pending tests longest first and sent one
        at a time (a worker holds the test it runs and the next: it needs both to start)."""

        def __init__(self, config: Any, log: Any) -> None:
            super().__init__(config, log)
            self.maxschedchunk = 1
            self.durations = load_durations()

        def schedule(self) -> None:
            if self.collection is not None or not self._check_nodes_have_same_collection():
                super().schedule()
                return
            collection = next(iter(self.node2collection.values()))
            self.collection = collection
            expected = [self.durations.get(n, UNLISTED_S) for n in collection]
            self.pending[:] = sorted(range(len(expected)), key=expected.__getitem__, reverse=True)
            for _ in range(2):  # round-robin: the longest tests go to different workers
                for node in self.nodes:
                    self._send_tests(node, 1)
            if not self.pending:
                for node in self.nodes:
                    node.shutdown()

    return LongestFirst(config, log)


def durations_from_junit(report: Path) -> dict[str, float]:
    """``{nodeid: seconds}`` (setup, call and teardown) of the tests that took at least
    :data:`LISTED_FROM_S` in a ``--junitxml`` report."""
    found: dict[str, float] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module, _, name = case.get("classname", "").rpartition(".")
        path = f"{module.replace('.', '/')}/{name}.py" if module else f"{name}.py"
        seconds = float(case.get("time", 0.0))
        if seconds >= LISTED_FROM_S:
            found[f"{path}::{case.get('name')}"] = round(seconds, 1)
    return found


def main(argv: list[str]) -> int:
    merged: dict[str, float] = {}
    for report in argv:
        merged |= durations_from_junit(Path(report))
    longest_first = dict(sorted(merged.items(), key=lambda item: -item[1]))
    DURATIONS.write_text(json.dumps(longest_first, indent=1) + "\n")
    print(f"wrote {len(merged)} tests' durations to {DURATIONS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
