"""Continued pre-training on a source no body saw: does a DEPT body adapt faster than STD's?

    python benchmarks/cpt.py --sources-file benchmarks/corpora.yaml --held-out en-shakespeare

Pre-trains two bodies of the same size on the same sources (all but ``--held-out``) with the
same budget, learning rate and schedule: DEPT (SPEC-OPT, federated, in process) and STD
(τ = 0.3, on the mixture with the global tokenizer). Then each body, and a freshly initialised
one as the from-scratch reference, gets new embeddings for the held-out source's own
tokenizer and is trained on that source alone, with validation bits per byte recorded every
``--eval-every`` steps. Writes ``cpt.md``, ``cpt.json`` and ``cpt.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from safetensors.torch import load_file

from benchmarks.compare import federate_in_process
from dept.baselines import BaselineRun, run_standard
from dept.config import DeptConfig, kebab, load_config, resolve_path, to_run_config
from dept.data import load_source_text
from dept.sources import SourceSpec, check_source_paths, load_sources
from dept.workspace import own_tokenizer
from server_app.report import dumps

log = logging.getLogger("cpt")


def write_sources(path: Path, specs: list[SourceSpec]) -> None:
    """A sources file listing ``specs`` (their paths are already absolute)."""
    path.write_text(yaml.safe_dump([{kebab(k): v for k, v in asdict(s).items()} for s in specs]))


def pretrain_dept(cfg: DeptConfig) -> dict:
    out = federate_in_process(to_run_config(cfg))
    return load_file(str(out / "body.safetensors"))


def adapt(
    cfg: DeptConfig, spec: SourceSpec, body: dict | None, name: str, steps: int, every: int
) -> BaselineRun:
    """Fresh embeddings for ``spec``'s own tokenizer on ``body``; bpb every ``every`` steps."""
    root = resolve_path(cfg.state_dir)
    text = load_source_text(spec, root / "cache", cfg.seed)
    tokenizer = own_tokenizer(spec, text, root / "cache", cfg.seed)
    rounds = max(1, steps // every)
    run_cfg = load_config(
        {
            **to_run_config(cfg),
            "num-server-rounds": rounds,
            "local-steps": every,
            "warmup-steps": min(cfg.warmup_steps, rounds * every - 1),
        }
    )
    return run_standard(
        run_cfg,
        [spec],
        root,
        temperature=0.0,
        sources_per_round=1,
        body=body,
        tokenizer_file=tokenizer,
        name=name,
        on_round=lambda r: log.info("%s step %d: val bpb %.4f", name, r.global_step, r.avg_val_bpb),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = resolve_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    specs = load_sources(resolve_path(args.sources_file))
    held = [s for s in specs if s.name == args.held_out]
    if not held:
        raise SystemExit(f"--held-out {args.held_out!r} is not a source of {args.sources_file}")
    check_source_paths(specs)
    seen_file, held_file = out / "pretrain-sources.yaml", out / "held-out.yaml"
    write_sources(seen_file, [s for s in specs if s is not held[0]])
    write_sources(held_file, held)
    common = {
        "model": args.model,
        "seq-len": args.seq_len,
        "batch-size": args.batch_size,
        "lr": args.lr,
        "warmup-steps": 10,
        "eval-bytes": args.eval_bytes,
        "seed": args.seed,
        "state-dir": str(out / "state"),
        "global-vocab-size": args.global_vocab_size,
    }
    seen = [s for s in specs if s is not held[0]]
    rounds = max(
        1, round(args.tokens / (len(seen) * args.local_steps * args.batch_size * args.seq_len))
    )
    pre = load_config(
        {
            **common,
            "sources-file": str(seen_file),
            "num-server-rounds": rounds,
            "local-steps": args.local_steps,
            "variant": "spec-opt",
            "output-dir": str(out / "dept-pretrain"),
        }
    )
    started = time.perf_counter()
    print(
        f"pre-training on {len(seen)} sources: {rounds} rounds x {args.local_steps} steps",
        flush=True,
    )
    bodies: dict[str, Any] = {"DEPT (SPEC-OPT) body": pretrain_dept(pre)}
    std = run_standard(
        pre, seen, resolve_path(pre.state_dir), temperature=0.3, sources_per_round=len(seen)
    )
    bodies["STD τ=0.3 body"] = std.body
    bodies["fresh body (from scratch)"] = None
    adapt_cfg = load_config({**common, "sources-file": str(held_file), "lr": args.cpt_lr})
    curves = {}
    for name, body in bodies.items():
        run = adapt(adapt_cfg, held[0], body, name, args.cpt_steps, args.eval_every)
        curves[name] = [(r.global_step, r.avg_val_bpb) for r in run.rounds]
    write_outputs(out, args, curves, time.perf_counter() - started)
    print(f"wrote {out / 'cpt.md'}, cpt.json and cpt.png", flush=True)
    return 0


def write_outputs(out: Path, args: argparse.Namespace, curves: dict, wall_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "cpt.json").write_text(
        dumps({"args": vars(args), "curves": curves, "wall_s": wall_s}, indent=2)
    )
    steps = [s for s, _ in next(iter(curves.values()))]
    lines = [
        f"# Continued pre-training on held-out `{args.held_out}` (model `{args.model}`)",
        "",
        f"Validation bits per byte after each number of steps (batch {args.batch_size} x "
        f"{args.seq_len}, lr {args.cpt_lr:g}, fresh embeddings for the source's own tokenizer).",
        "",
        "| body | " + " | ".join(f"step {s}" for s in steps) + " |",
        "|" + "---|" * (len(steps) + 1),
    ]
    for name, curve in curves.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.4f}" for _, v in curve) + " |")
    (out / "cpt.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, curve in curves.items():
        ax.plot(*zip(*curve, strict=True), marker="o", label=name)
    ax.set_xlabel("continued pre-training steps")
    ax.set_ylabel(f"{args.held_out} validation bits per byte")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "cpt.png", dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources-file", required=True)
    parser.add_argument("--held-out", required=True, help="the source left out of pre-training")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tokens", type=float, default=5e5, help="pre-training tokens per body")
    parser.add_argument("--local-steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=8e-3, help="pre-training learning rate")
    parser.add_argument("--cpt-lr", type=float, default=8e-3)
    parser.add_argument("--cpt-steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--eval-bytes", type=int, default=12288)
    parser.add_argument("--global-vocab-size", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/cpt")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
