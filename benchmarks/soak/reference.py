"""The fault-free runs a soak is judged against: the same run config (read from the soak's
checkpoint), the same sources and node settings, driven in process (``LocalGrid``) rather
than through the deployment, which computes the same numbers: sampling and aggregation go
by source name, never by node id or arrival order.

- The **twin** trains each source in exactly the rounds the soak took an update of it from
  (a source the soak lost a round of is told to fail that round), from the older state its
  node fell back to where a fault took its newest (as the soak's ``state_events`` say): the
  soak's participation replayed without faults. A soak that lost nothing else ends where its
  twin does, bit for bit; a gap is a cost the faults had that no record explains (a state
  lost silently, a stretch of data skipped or replayed).
- The **references** are the fault-free run under other seeds: their spread is the scale a
  gap is judged on (:mod:`benchmarks.soak.checks`).

Each runs as its own process (``python -m benchmarks.soak.reference RUN_DIR OUT_DIR SEED
ABSENT_JSON SOURCES...``) with one thread, as the deployment's trainers run, so float sums
are made in the same order.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from dept.state.jsonl import read_lines
from server_app.checkpoint import saved_run_config

VOCAB_SIZE = 300  # as tests/deploy/test_deployment.py's node_config gives every node
ABSENT = "absent in the soak"
# dept.train.source_client's state events: "... from the state of round K in round R, not
# round L's (...)" and "fresh ... in round R: state lost (...)"
OLDER_STATE = re.compile(r"from the state of round (-?\d+) in round (\d+)")
FRESH_STATE = re.compile(r"^fresh .* in round (\d+):")


def node_configs(sources: tuple[str, ...], state: Path) -> list[dict[str, Any]]:
    """The deployment's node configs, with the work done in process (no warm worker)."""
    return [
        {
            "source": s,
            "path": f"builtin:synthetic-{s}",
            "vocab-size": VOCAB_SIZE,
            "state-dir": str(state / s),
            "warm-worker": "false",
        }
        for s in sources
    ]


def absences(run_dir: Path, sources: tuple[str, ...]) -> dict[int, list[str]]:
    """Per training round of the run in ``run_dir``, the sources it took no update from."""
    return {
        r: [s for s in sources if not line["sources"].get(s, {}).get("tokens")]
        for r, line in _last_lines(run_dir).items()
        if r > 0
    }


def fallbacks(run_dir: Path) -> dict[int, dict[str, int]]:
    """Per round of the run in ``run_dir``, the sources that trained it from an older state
    than their last (a state a fault took), and that state's round (-1: fresh), as each
    node said (``state_events``)."""
    found: dict[int, dict[str, int]] = {}
    for r, line in _last_lines(run_dir).items():
        for event in line.get("state_events", []):
            older = OLDER_STATE.search(event["event"])
            fresh = FRESH_STATE.search(event["event"])
            if older and int(older.group(2)) == r:
                found.setdefault(r, {})[event["source"]] = int(older.group(1))
            elif fresh and int(fresh.group(1)) == r:
                found.setdefault(r, {})[event["source"]] = -1
    return found


def _last_lines(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Each round's last line (a resumed server rewrites the rounds after its checkpoint)."""
    last = {int(line["round"]): line for line in read_lines(run_dir / "metrics.jsonl")}
    return dict(sorted(last.items()))


def run_reference(
    run_dir: Path,
    out: Path,
    sources: tuple[str, ...],
    *,
    seed: int | None = None,
    absent: dict[int, list[str]] | None = None,
    fallback: dict[int, dict[str, int]] | None = None,
) -> Path:
    """Train the fault-free run of the config in ``run_dir`` into ``out/run`` (its folder):
    under its own seed or ``seed``, each source absent from the rounds ``absent`` names, and
    training the rounds ``fallback`` names from the older state the soak's node fell back to."""
    out.mkdir(parents=True, exist_ok=True)
    replay = {"absent": absent or {}, "fallback": fallback or {}}
    (out / "absent.json").write_text(json.dumps(replay))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "benchmarks.soak.reference", str(run_dir), str(out)]
    command += [str(-1 if seed is None else seed), str(out / "absent.json"), *sources]
    subprocess.run(command, check=True, env=env, timeout=1800)
    return out / "run"


def main(argv: list[str]) -> None:
    from flwr.app import Error, Message, MessageType

    from client_app.app import app as client_app  # torch and co., only in this process
    from dept.wire import keys
    from server_app.federation import run_federation
    from server_app.local_grid import LocalGrid

    run_dir, out, seed, absent_file = Path(argv[0]), Path(argv[1]), int(argv[2]), argv[3]
    sources = tuple(argv[4:])
    saved = saved_run_config(run_dir)
    if saved is None:
        raise SystemExit(f"{run_dir} holds no checkpoint to read the run config from")
    config = {**saved[1], "resume": False, "output-dir": str(out / "run")}
    if seed >= 0:
        config["seed"] = seed
    replay = json.loads(Path(absent_file).read_text())
    absent = {int(r): set(s) for r, s in replay["absent"].items()}
    fallback = {int(r): by_source for r, by_source in replay["fallback"].items()}

    def as_in_the_soak(msg: Message, context: Any) -> Message:
        """The client app, but a source fails the rounds the soak took nothing from it, and
        trains from the older state its node fell back to where the soak's did."""
        content = msg.content.config_records.get(keys.CONFIG)
        server_round = int(str(content.get(keys.SERVER_ROUND, 0))) if content else 0
        source = str(content.get(keys.SOURCE, "")) if content else ""
        if msg.metadata.message_type == MessageType.TRAIN:
            if source in absent.get(server_round, ()):
                return Message(Error(code=0, reason=f"source {source}: {ABSENT}"), reply_to=msg)
            if source in fallback.get(server_round, {}):
                forget_states_after(out / "state" / source, fallback[server_round][source])
        return client_app(msg, context)

    grid = LocalGrid(as_in_the_soak, node_configs(sources, out / "state"), config)
    run_federation(grid, config)


def forget_states_after(state: Path, kept: int) -> None:
    """Remove a node's round states after round ``kept`` (-1: all), as a fault took them."""
    for folder in state.glob("runs/*/*/round-[0-9][0-9][0-9][0-9]"):
        if int(folder.name.removeprefix("round-")) > kept:
            shutil.rmtree(folder)


if __name__ == "__main__":
    main(sys.argv[1:])
