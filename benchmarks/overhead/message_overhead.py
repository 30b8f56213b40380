"""Per-message fixed cost of a deployment, cold (a fresh process builds everything) against
warm (the node's warm worker, :mod:`client_app.worker`), side by side in the same rounds.

A real loopback deployment (``tests/deploy/loopback.py``): one SuperLink and two
SuperNodes per model, one with ``warm-worker=false`` and one with ``warm-worker=true``,
both trained in every round, every process logging with time stamps
(``FLWR_LOG_LEVEL=DEBUG``). :mod:`benchmarks.overhead.message_timeline` reads each message's way
back from the logs, from the ServerApp's push to the reply's upload, in segments: Flower's
(the SuperNode's poll, the process start and imports, the task and app bundle, the reply's
pickup and upload) and ours: the thin app's import, (a) arrival at the handler to the first
local step and (b) the last step to the reply. The first message a node gets (the query;
on the warm node it starts the worker) is reported apart from the medians.

    python -m benchmarks.overhead.message_overhead            # debug and tiny, 2 rounds of 2 steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.measure import print_table, result_header, write_outputs
from benchmarks.overhead.message_timeline import SEGMENTS, messages, round_walls
from tests.deploy.loopback import Loopback, wait_for_line

NAME = "message-overhead"
ARMS = {"latin": "cold", "greek": "warm"}
RUN_S = 1800.0
KINDS = ("train", "evaluate")
SUMMED = ("ours", "flower", "total")


def run_config(model: str, rounds: int, steps: int, out: Path) -> str:
    config: dict[str, Any] = {
        "model": model,
        "seq-len": 64,
        "batch-size": 4,
        "local-steps": steps,
        "warmup-steps": 1,
        "eval-bytes": 2048,
        "num-server-rounds": rounds,
        "min-available-nodes": 2,
        "wait-for-nodes-s": 120.0,
        "round-timeout-s": 900.0,
        "output-dir": str(out),
    }
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in config.items())


def node_config(source: str, state: Path) -> str:
    warm = str(ARMS[source] == "warm").lower()
    return (
        f"source='{source}' path='builtin:synthetic-{source}' vocab-size=300 "
        f"state-dir='{state / source}' warm-worker={warm}"
    )


def federation(model: str, rounds: int, steps: int, root: Path) -> dict[str, Any]:
    """One short federation on loopback: a row per message of its two nodes, and the
    rounds' wall times."""
    deployment = Loopback(root)
    deployment.env["FLWR_LOG_LEVEL"] = "DEBUG"  # time stamps on every line, ours too
    try:
        deployment.start_superlink()
        nodes = [deployment.add_node(s, node_config(s, root / "state")) for s in ARMS]
        run = deployment.run(run_config(model, rounds, steps, root / "out"))
        wait_for_line(run, r"summary written to|validation bits per byte", RUN_S)
        time.sleep(5)  # the last replies' uploads
        superlink = deployment.processes[0].text()
        rows = [
            {"model": model, "arm": ARMS[node.source], **row}
            for node in nodes
            for row in messages(superlink, node.supernode.text(), node.log())
        ]
        return {"rows": rows, "rounds": round_walls(run.text())}
    finally:
        deployment.close()


def _median(rows: list[dict[str, Any]], key: str) -> float:
    values = [float(r[key]) for r in rows]
    return statistics.median(values) if values else float("nan")


def segments_table(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Per model, arm and kind: the median of each segment over the messages after the
    node's first."""
    table = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for kind in KINDS:
            for arm in ("cold", "warm"):
                mine = [
                    r
                    for r in rows
                    if (r["model"], r["arm"], r["kind"]) == (model, arm, kind) and r["index"]
                ]
                medians = [_median(mine, name) for name, _ in SEGMENTS]
                table.append([model, kind, arm, len(mine), *medians, _median(mine, "total")])
    return table


def summary_table(rows: list[dict[str, Any]], walls: dict[str, list[float]]) -> list[list[Any]]:
    """Per model and arm: a train message's fixed cost, ours and Flower's, the first
    message (a warm node's worker starts there), and the median round."""
    table = []
    for model, model_walls in walls.items():
        for arm in ("cold", "warm"):
            mine = [r for r in rows if (r["model"], r["arm"]) == (model, arm)]
            trains = [r for r in mine if r["kind"] == "train"]
            first = next((r for r in mine if r["index"] == 0), None)
            table.append(
                [
                    model,
                    arm,
                    _median(trains, "(a) to step 1") + _median(trains, "(b) to reply"),
                    *(_median(trains, key) for key in SUMMED),
                    _median(trains, "steps"),
                    float(first["ours"]) if first else float("nan"),
                    statistics.median(model_walls) if model_walls else float("nan"),
                ]
            )
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    walls: dict[str, list[float]] = {}
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="dept-msg-") as work:
            result = federation(model, args.rounds, args.local_steps, Path(work))
        rows += result["rows"]
        walls[model] = result["rounds"]
    names = [name for name, _ in SEGMENTS]
    columns = ("model", "kind", "arm", "msgs", *names, "total")
    title = "one message's way, median s (messages after each node's first), loopback"
    segments = print_table(title, columns, segments_table(rows))
    columns = ("model", "arm", "(a)+(b)", *SUMMED, "steps", "1st msg ours", "round")
    title = "train message: fixed cost (a)+(b), ours and Flower's, median s; round wall"
    summary = print_table(title, columns, summary_table(rows, walls))
    result_json = {
        **result_header(NAME, args, None),
        "segments": dict(SEGMENTS),
        "round_walls_s": walls,
        "table": segments + summary,
    }
    write_outputs(args.out, NAME.replace("-", "_"), result_json, rows)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["debug", "tiny"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{NAME}"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
