"""Per-message fixed cost of a deployment, cold (a fresh process builds everything) against
warm (the node's warm worker, :mod:`client_app.worker`), side by side in the same rounds.

A real loopback deployment (``tests/deploy/loopback.py``): one SuperLink and two
SuperNodes per model, one with ``warm-worker=false`` and one with ``warm-worker=true``,
both trained in every round. Each ClientApp process logs how long after its start (the
message's arrival) it replied and how much of that the local steps took; the rest is the
fixed cost: arrival to first training step plus last step to reply (one number: the two
parts are not told apart). The first message a warm node gets starts its worker, so it is
reported apart ("first") from the messages after it.

    python benchmarks/message_overhead.py            # debug and tiny, 3 rounds of 2 steps
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.measure import print_table, result_header, write_outputs
from tests.deploy.loopback import Loopback, Node, wait_for_line

NAME = "message-overhead"
ANSWER = re.compile(
    r"(?P<source>\S+): (?P<kind>train|evaluate|query) answered (?P<total>[\d.]+) s after "
    r"arrival, (?P<training>[\d.]+) s of it training"
)
ARMS = {"latin": "cold", "greek": "warm"}
RUN_S = 1800.0


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


def federation(model: str, rounds: int, steps: int, root: Path) -> list[dict[str, Any]]:
    """One short federation on loopback; a row per ClientApp message of its two nodes."""
    deployment = Loopback(root)
    try:
        deployment.start_superlink()
        nodes = [deployment.add_node(s, node_config(s, root / "state")) for s in ARMS]
        run = deployment.run(run_config(model, rounds, steps, root / "out"))
        wait_for_line(run, r"summary written to|validation bits per byte", RUN_S)
        time.sleep(2)  # the last replies' log lines
        return [row for node in nodes for row in _answers(node, model)]
    finally:
        deployment.close()


def _answers(node: Node, model: str) -> list[dict[str, Any]]:
    rows = []
    for i, match in enumerate(ANSWER.finditer(node.log())):
        total, training = float(match["total"]), float(match["training"])
        arm = ARMS[node.source]
        rows.append(
            {
                "model": model,
                "arm": arm,
                "kind": match["kind"],
                "first": i == 0,
                "total_s": total,
                "training_s": training,
                "fixed_s": round(total - training, 3),
            }
        )
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[list[Any]]:
    table = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for arm in ("cold", "warm"):
            mine = [r for r in rows if r["model"] == model and r["arm"] == arm]
            later = [r["fixed_s"] for r in mine if not r["first"]]
            trains = [r["fixed_s"] for r in mine if not r["first"] and r["kind"] == "train"]
            first = next((r["fixed_s"] for r in mine if r["first"]), float("nan"))
            median = statistics.median(later) if later else float("nan")
            train = statistics.median(trains) if trains else float("nan")
            table.append([model, arm, len(mine), first, median, train, max(later, default=0)])
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="dept-msg-") as work:
            rows += federation(model, args.rounds, args.local_steps, Path(work))
    columns = ("model", "arm", "messages", "first s", "median s", "train median s", "max s")
    title = "fixed cost per message (arrival to reply minus local steps), loopback"
    table = print_table(title, columns, summarise(rows))
    result = {**result_header(NAME, args, None), "table": table}
    write_outputs(args.out, NAME.replace("-", "_"), result, rows)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["debug", "tiny"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{NAME}"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
