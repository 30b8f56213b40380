"""How much of a round is training? A round's wall time against its clients' training time.

    python -m benchmarks.overhead.round_overhead

Runs the real ServerApp and ClientApp code in process (one node per source, each source
trained and evaluated every round, the app's default local steps) through a grid that times
every message. The in-process grid runs the clients one after another, so the round's
critical path is the *sum* of its clients' work; in a runtime with parallel clients it would
be the slowest client's. Overhead = round wall time − Σ clients' training-loop time (what
``train_local`` times), split into:

- client setup: a train message's time in the ClientApp outside the loop (arrays decoded,
  model built, φ and optimizer state loaded and saved, reply encoded);
- evaluation: the round's evaluate messages (the app evaluates every round by default);
- server: the rest (sampling, encoding what is sent, aggregation, outer step, checkpoint,
  report).

A second, profiled run (``cProfile``, one round) breaks these down by function; the
profiler slows Python-heavy code more than torch kernels, so read its column as shares.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
from pathlib import Path
from typing import Any

import torch

from benchmarks.measure import (
    common_arguments,
    corpora_run_config,
    parse_quick,
    print_table,
    result_header,
    write_outputs,
)
from benchmarks.timed_grid import timed_federation
from dept.wire import keys
from dept_cli.in_process import federate_in_process

TARGET = 0.10
DEFAULT_SOURCES = "en-shakespeare,de-novels,ru-chekhov"
# (label, file suffix, function) of the steps of a round worth seeing in the profile.
COMPONENTS = (
    ("client: decode arrays", "arrayrecord.py", "to_torch_state_dict"),
    ("client: build model", "dept/model/build.py", "build_model"),
    ("client: load state", "dept/state/workspace.py", "load_state"),
    ("client: local training", "dept/train/local.py", "train_local"),
    ("client: save state", "dept/state/workspace.py", "save_state"),
    ("client: evaluation", "dept/train/evaluate.py", "evaluate_stream"),
    ("server: aggregate + outer step", "dept_strategy/strategy.py", "aggregate_train"),
    ("server: checkpoint", "server_app/checkpoint.py", "save_checkpoint"),
    ("server: report", "server_app/report.py", "round_done"),
    ("both: encode arrays", "arrayrecord.py", "__init__"),
)


def timed_run(run_config: dict[str, Any]) -> list[dict[str, Any]]:
    """One federation; per training round, where its wall time went."""
    out, grid = timed_federation(run_config)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    walls = {r["round"]: r["wall_s"] for r in map(json.loads, lines)}
    rows = []
    for server_round in sorted(r for r in walls if r > 0):
        mine = [d for d in grid.deliveries if d.server_round == server_round]
        train = [d for d in mine if d.message_type == "train"]
        wall = walls[server_round] - walls[server_round - 1]
        training = sum(float(d.metrics[keys.TRAIN_SECONDS]) for d in train)
        train_msgs = sum(d.seconds for d in train)
        evaluation = sum(d.seconds for d in mine if d.message_type == "evaluate")
        rows.append(
            {
                "round": server_round,
                "clients": len(train),
                "wall_s": wall,
                "training_s": training,
                "client_setup_s": train_msgs - training,
                "evaluation_s": evaluation,
                "server_s": wall - train_msgs - evaluation,
                "overhead_share": (wall - training) / wall,
                "overhead_share_excl_eval": (wall - training - evaluation) / (wall - evaluation),
                "max_client_training_s": max(float(d.metrics[keys.TRAIN_SECONDS]) for d in train),
            }
        )
    return rows


def profiled_run(run_config: dict[str, Any]) -> list[dict[str, Any]]:
    """One round under cProfile: cumulative seconds of each of :data:`COMPONENTS`."""
    profile = cProfile.Profile()
    profile.runcall(federate_in_process, run_config)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())  # Σ own time = the profiled wall time
    rows = []
    for label, suffix, function in COMPONENTS:
        seconds = sum(
            v[3]
            for (file, _, name), v in stats.items()
            if name == function and file.endswith(suffix)
        )
        rows.append({"component": label, "seconds": seconds, "share": seconds / total})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    def run_config(rounds: int, work: Path) -> dict[str, Any]:
        return corpora_run_config(
            args.sources.split(","),
            work,
            model=args.model,
            local_steps=args.local_steps,
            num_server_rounds=rounds,
            eval_bytes=args.eval_bytes,
        )

    rounds = timed_run(run_config(args.rounds, args.work))
    profile = profiled_run(run_config(1, args.work / "profiled"))
    result = summarise(args, rounds, profile)
    write_outputs(args.out, "round_overhead", result, rounds)
    return 0


def summarise(args: argparse.Namespace, rounds: list[dict], profile: list[dict]) -> dict:
    columns = [
        "wall_s",
        "training_s",
        "client_setup_s",
        "evaluation_s",
        "server_s",
        "overhead_share",
        "overhead_share_excl_eval",
    ]
    table = print_table(
        f"round overhead: {args.model}, {len(args.sources.split(','))} sources in sequence, "
        f"{args.local_steps} local steps, eval-bytes {args.eval_bytes}, {args.threads} thread(s) "
        f"(target: overhead <= {TARGET:.0%} of the round)",
        ["round", *[c.removesuffix("_s") for c in columns]],
        [(r["round"], *(r[c] for c in columns)) for r in rounds],
    )
    table += print_table(
        "where a profiled round's time goes (cumulative; nested calls overlap)",
        ["component", "seconds", "share"],
        [(p["component"], p["seconds"], p["share"]) for p in profile],
    )
    later = rounds[1:] or rounds  # round 1 also pays the one-time setup of every source
    overhead = max(r["overhead_share"] for r in later)
    excl_eval = max(r["overhead_share_excl_eval"] for r in later)
    return {
        **result_header("round_overhead", args, args.threads),
        "table": table,
        "critical_path": "sum of the clients' training time (the in-process grid is sequential)",
        "target_overhead_share": TARGET,
        "worst_overhead_share_after_round_1": overhead,
        "worst_overhead_share_excl_eval_after_round_1": excl_eval,
        "met": overhead <= TARGET,
        "met_excl_eval": excl_eval <= TARGET,
        "profile": profile,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default=DEFAULT_SOURCES, help="sources of corpora.yaml")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--local-steps", type=int, default=25, help="the app's default")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--eval-bytes", type=int, default=65536, help="the app's default")
    common_arguments(parser, "round-overhead", "debug model, 2 sources, 5 steps")
    quick = {"model": "debug", "local_steps": 5, "rounds": 2, "eval_bytes": 4096}
    sources = parser.get_default("sources")
    return parse_quick(parser, argv, sources=",".join(sources.split(",")[:2]), **quick)


if __name__ == "__main__":
    raise SystemExit(main())
