"""What the losses a fault could cost silently do to the soak's final figure, and what the
seeds do: the scale that says why the soak is judged against its twin exactly, not within a
tolerance.

The soak's run (four synthetic sources, eight rounds of the ``debug`` preset, as the soak's
run config) is trained in process under ``--seeds`` seeds, then under the first seed with
one source's restart before ``--at-round`` losing one thing a restart must keep:

- ``no-moments``: its AdamW moments (the optimizer starts fresh);
- ``skip-data``: a stretch of its stream (``--stretch`` batches skipped);
- ``replay-data``: the same stretch trained again.

Each prints one JSON line and the table compares every run's average final bits per byte
with the first seed's; ``effect_sizes.json`` and ``effect_sizes.md`` go to ``--out``::

    python -m benchmarks.soak.effect_sizes --out outputs/soak-effects
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.soak.checks import average, final_bpb
from benchmarks.soak.reference import node_configs
from client_app.app import app as client_app
from dept.state.workspace import FoundState
from dept.train import source_client
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.deploy.loopback import DEBUG_TRAINING

SOURCES = ("latin", "cyrillic", "greek", "georgian")
CONFIG: dict[str, Any] = {  # the soak's run config, in process
    **DEBUG_TRAINING,
    "num-server-rounds": 8,
    "fraction-evaluate": 0.0,
    "wait-for-nodes-s": 30.0,
    "round-timeout-s": 60.0,
}
Loss = Callable[[FoundState, int], None]


def _no_moments(found: FoundState, stretch: int) -> None:
    assert found.state is not None
    found.state.optimizer = None


def _skip_data(found: FoundState, stretch: int) -> None:
    assert found.state is not None
    found.state.position.offset += stretch * int(CONFIG["batch-size"])


def _replay_data(found: FoundState, stretch: int) -> None:
    assert found.state is not None
    offset = found.state.position.offset - stretch * int(CONFIG["batch-size"])
    found.state.position.offset = max(0, offset)


LOSSES: dict[str, Loss] = {
    "no-moments": _no_moments,
    "skip-data": _skip_data,
    "replay-data": _replay_data,
}


def run(folder: Path, seed: int) -> dict[str, float]:
    """One in-process run of the soak's config; each source's final bits per byte."""
    config = {**CONFIG, "seed": seed, "output-dir": str(folder / "run")}
    run_federation(LocalGrid(client_app, node_configs(SOURCES, folder / "state"), config), config)
    return final_bpb(folder / "run")


def with_loss(loss: Loss, source: str, at_round: int, stretch: int) -> Callable[[], None]:
    """Make ``source``'s state, as its node loads it before ``at_round``, lose what
    ``loss`` takes; returns the undo."""
    original = source_client.SourceClient.state

    def lossy(self, before_round, attempt=None, consume=False, last_trained=None):
        found = original(self, before_round, attempt, consume, last_trained)
        if self.spec.name == source and before_round == at_round and consume:
            loss(found, stretch)
        return found

    source_client.SourceClient.state = lossy  # type: ignore[method-assign]
    return lambda: setattr(source_client.SourceClient, "state", original)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        rows.append({"run": f"seed {seed}", "seed": seed, **run(args.work / f"seed-{seed}", seed)})
        print(json.dumps(rows[-1]), flush=True)
    for name, loss in LOSSES.items():
        undo = with_loss(loss, args.source, args.at_round, args.stretch)
        try:
            finals = run(args.work / name, 0)
        finally:
            undo()
        rows.append({"run": f"{name} ({args.source}, round {args.at_round})", "seed": 0, **finals})
        print(json.dumps(rows[-1]), flush=True)
    for row in rows:
        row["avg"] = average(row[s] for s in SOURCES)
    base = rows[0]["avg"]
    seeds = [r["avg"] for r in rows[: args.seeds]]
    spread = (max(seeds) - min(seeds)) / average(seeds)
    lines = [
        f"# What a silent loss moves, against the seeds ({len(SOURCES)} sources, 8 rounds)",
        "",
        "| run | average final bpb | against seed 0 |",
        "|---|---:|---:|",
        *(f"| {r['run']} | {r['avg']:.4f} | {r['avg'] / base - 1:+.3%} |" for r in rows),
        "",
        f"Spread of the seeds' averages, (max − min) / mean: {spread:.2%}.",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "effect_sizes.json").write_text(
        json.dumps({"config": CONFIG, "rows": rows, "seed_spread": spread}, indent=2) + "\n"
    )
    (args.out / "effect_sizes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak.effect_sizes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=5, help="fault-free seeds (default 5)")
    parser.add_argument("--source", default="latin", choices=SOURCES, help="the restarted one")
    parser.add_argument("--at-round", type=int, default=5, help="its restart, before this round")
    parser.add_argument("--stretch", type=int, default=16, help="batches skipped or replayed")
    parser.add_argument("--work", type=Path, default=Path("outputs/soak-effects/work"))
    parser.add_argument("--out", type=Path, default=Path("outputs/soak-effects"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
