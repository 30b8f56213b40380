"""Bytes a round really moves, against what the shared tensors weigh, for every variant.

    python -m benchmarks.comparison.communication

Runs one training round of each variant (and each ``compression`` the app offers) through
the real ServerApp and ClientApp in process and counts, per client and direction:

- ``ledger``: what the strategy counts (the arrays' bytes, ``metrics.jsonl``; TRIM's
  one-time query of each source's V_k is reported apart, as ``one_time_up``);
- ``wire``: the whole Message as the runtime forwards it (its protobuf size: arrays,
  their npy headers, keys, config and metrics);
- ``theory``: the shared tensors' numbers × bytes per number: θ (float32 down; up as the
  compression codes it), plus the whole φ for GLOB, plus the V_k rows of φ and their int32
  ids (up) for TRIM.

The reduction column compares with synchronous data-parallel training of the same steps:
every step, a float32 gradient of the client's whole model (θ + its φ) up and down,
at ``--ddp-steps`` local steps per round (the app's default 25).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import fields
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
from dept.config import DeptConfig, load_config
from dept.model.families import model_width
from dept.model.variants import VARIANTS, variant
from dept.train.sharing import initial_tensors

TARGET = 1.02
FLOAT32 = 4


def compressions() -> tuple[str, ...]:
    """The app's ``compression`` choices, or only ``none`` where it has no such key."""
    if "compression" not in {f.name for f in fields(DeptConfig)}:
        return ("none",)
    return ("none", "fp16", "int8")


def coded_bytes(numel: int, compression: str) -> int:
    """Bytes of ``numel`` float32 values once coded for the trip up."""
    if compression == "none":
        return numel * FLOAT32
    if compression == "fp16":
        return numel * 2
    from dept.wire.compression import BLOCK

    return numel + math.ceil(numel / BLOCK) * FLOAT32  # int8 codes + a float32 scale per block


def theory(
    cfg: DeptConfig, compression: str, shared_rows: int, sent_rows: float | None = None
) -> tuple[float, float]:
    """(down, up) bytes per client of the tensors a variant shares; ``shared_rows``: the φ
    rows it is sent (TRIM: |V_k|; GLOB: the whole vocabulary); ``sent_rows``: the rows it
    sends back under ``embedding-rows=seen`` (those its round saw), each with its int32 id
    and occurrence count; by default all it was sent, with ids for TRIM's."""
    tensors, embedding_names = initial_tensors(cfg)
    width = model_width(cfg.model)
    body = [t.numel() for n, t in tensors.items() if n not in embedding_names]
    down = (sum(body) + shared_rows * width * len(embedding_names)) * FLOAT32
    up_rows = shared_rows if sent_rows is None else sent_rows
    sizes = body + [round(up_rows * width)] * len(embedding_names)
    up = float(sum(coded_bytes(n, compression) for n in sizes))
    if sent_rows is not None:
        up += sent_rows * 2 * FLOAT32  # the rows' int32 ids and counts
    elif variant(cfg.variant).embeddings == "rows":
        up += shared_rows * FLOAT32  # the rows' int32 ids
    return down, up


def measure(run_config: dict[str, Any], ddp_steps: int) -> dict[str, Any]:
    """One round of one variant/compression: bytes per client, each way, three ways."""
    cfg = load_config(run_config)
    out, grid = timed_federation(run_config, wire_bytes=True)
    summary = json.loads((out / "summary.json").read_text())
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[1])  # round 1
    train_up = sum(s["bytes_up"] for s in first["sources"].values())
    trains = [d for d in grid.deliveries if d.message_type == "train"]
    clients = len(trains)
    width = model_width(cfg.model)
    factor = 1 if cfg.tie_embeddings else 2
    rows = [s["embedding_params"] // (width * factor) for s in summary["sources"].values()]
    shared = {"all": cfg.global_vocab_size, "rows": sum(rows) / len(rows) - 1}  # "other" row
    sharing = variant(cfg.variant).embeddings
    sent = None
    if sharing != "none" and cfg.embedding_rows == "seen":
        seen = [s["embedding_rows_seen"] for s in first["sources"].values()]
        sent = sum(seen) / len(seen)
    down, up = theory(cfg, cfg_compression(cfg), int(shared.get(sharing, 0)), sent)
    emb = sum(s["embedding_params"] for s in summary["sources"].values()) / clients
    ddp = 2 * (summary["body_params"] + emb) * FLOAT32 * ddp_steps
    comm = summary["comm"]
    return {
        "variant": cfg.variant,
        "compression": cfg_compression(cfg),
        "clients": clients,
        "body_params": summary["body_params"],
        "theory_down": down,
        "ledger_down": comm["bytes_down"] / clients,
        "wire_down": sum(d.wire_bytes_down for d in trains) / clients,
        "theory_up": up,
        "ledger_up": train_up / clients,
        "one_time_up": comm["bytes_up"] - train_up,  # TRIM: each source's V_k, asked once
        "wire_up": sum(d.wire_bytes_up for d in trains) / clients,
        "ddp_bytes": ddp,
    }


def cfg_compression(cfg: DeptConfig) -> str:
    return str(getattr(cfg, "compression", "none"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.variants:
        for compression in args.compressions:
            extra = {"compression": compression} if compression != "none" else {}
            run_config = corpora_run_config(
                args.sources.split(","),
                args.work,
                model=args.model,
                variant=name,
                num_server_rounds=1,
                local_steps=args.local_steps,
                eval_bytes=4096,
                output_dir=str(args.work / f"{name}-{compression}"),
                **extra,
            )
            rows.append(measure(run_config, args.ddp_steps))
    result = summarise(args, rows)
    write_outputs(args.out, "communication", result, rows)
    return 0


def summarise(args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    cells = []
    for r in rows:
        r["ratio_down"] = r["ledger_down"] / r["theory_down"]
        r["ratio_up"] = r["ledger_up"] / r["theory_up"]
        r["wire_ratio_down"] = r["wire_down"] / r["theory_down"]
        r["wire_ratio_up"] = r["wire_up"] / r["theory_up"]
        r["reduction_vs_ddp"] = r["ddp_bytes"] / (r["ledger_down"] + r["ledger_up"])
        cells.append(
            (
                r["variant"],
                r["compression"],
                _mb(r["theory_down"]),
                r["ratio_down"],
                r["wire_ratio_down"],
                _mb(r["theory_up"]),
                r["ratio_up"],
                r["wire_ratio_up"],
                f"{r['reduction_vs_ddp']:.0f}x",
            )
        )
    text = print_table(
        f"communication per client per round: {args.model}, {args.sources} "
        f"(target: <= {TARGET}x theory; DDP at {args.ddp_steps} local steps)",
        [
            "variant",
            "compression",
            "theory down",
            "ledger/theory",
            "wire/theory",
            "theory up",
            "ledger/theory",
            "wire/theory",
            "vs DDP",
        ],
        cells,
    )
    worst = max(max(r["ratio_down"], r["ratio_up"]) for r in rows)
    worst_wire = max(max(r["wire_ratio_down"], r["wire_ratio_up"]) for r in rows)
    return {
        **result_header("communication", args, args.threads),
        "table": text,
        "target_ratio": TARGET,
        "worst_ledger_ratio": worst,
        "worst_wire_ratio": worst_wire,
        "met": worst <= TARGET,
        "met_on_the_wire": worst_wire <= TARGET,
    }


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default="en-shakespeare,de-novels")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    parser.add_argument("--compressions", type=lambda s: s.split(","), default=list(compressions()))
    parser.add_argument("--local-steps", type=int, default=2, help="bytes do not depend on it")
    parser.add_argument("--ddp-steps", type=int, default=25, help="local steps DDP would sync")
    common_arguments(parser, "communication", "the debug model")
    return parse_quick(parser, argv, model="debug")


if __name__ == "__main__":
    raise SystemExit(main())
