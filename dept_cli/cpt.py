"""Continued pre-training on a source no body saw: does a DEPT body adapt faster than STD's?

Pre-trains two bodies of the same size on the same sources (all but ``--held-out``) with the
same budget, learning rate and schedule: DEPT (``--variant``, federated, in process) and STD
(τ = 0.3, on the mixture with the global tokenizer). Then each body, and a freshly initialised
one as the from-scratch reference, gets new embeddings for the held-out source's own
tokenizer and is trained on that source alone, with validation bits per byte recorded every
``--eval-every`` steps. Writes ``cpt.md``, ``cpt.json`` and ``cpt.png`` to ``--out``, and each
adapted model to ``--out``/models/<body> (a model folder ``transformers``, ``dept eval`` and
``dept finetune`` load: the held-out source's tasks run on it).
"""

from __future__ import annotations

import argparse
import logging
import re
import time
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from transformers import PreTrainedModel

from dept.cli_help import HelpFormatter, plain
from dept.config import DeptConfig, load_config, to_run_config
from dept.data.corpus import load_source_text
from dept.data.sources import SourceSpec, check_source_paths, load_sources, write_sources
from dept.export import export_trained
from dept.logs import log_to_terminal
from dept.model.variants import VARIANTS
from dept.paths import resolve_path
from dept.state.strict_json import dumps
from dept.state.workspace import own_tokenizer
from dept.train.baselines import BaselineRound, BaselineRun, run_standard
from dept_cli.in_process import federate_in_process

log = logging.getLogger("cpt")
EXAMPLES = """examples:
  dept cpt --sources-file benchmarks/corpora.yaml --held-out en-shakespeare
  dept cpt --sources-file my-sources.yaml --held-out de-novels --variant spec --cpt-steps 400
"""


def pretrain_dept(cfg: DeptConfig) -> dict:
    """The body a federation of ``cfg`` ends with."""
    out = federate_in_process(to_run_config(cfg))
    return load_file(str(out / "body.safetensors"))


def adapt(
    cfg: DeptConfig,
    spec: SourceSpec,
    body: dict | None,
    name: str,
    steps: int,
    every: int,
    model_dir: Path | None = None,
) -> BaselineRun:
    """Fresh embeddings for ``spec``'s own tokenizer on ``body``; bpb every ``every`` steps;
    the adapted model saved to ``model_dir`` (where given) after the last."""
    root = resolve_path(cfg.state_dir)
    text = load_source_text(spec, root / "cache", cfg.seed)
    tokenizer = own_tokenizer(spec, text, root / "cache", cfg.seed)
    rounds = max(1, steps // every)
    run_cfg = load_config(
        {
            **to_run_config(cfg),
            "num-server-rounds": rounds,
            "local-steps": every,  # a warmup-steps longer than the steps is clamped
        }
    )

    def keep_final(record: BaselineRound, model: PreTrainedModel) -> None:
        if model_dir is not None and record.round == run_cfg.num_server_rounds:
            how = f"by continued pre-training ({name}) on {spec.name}, its own tokenizer"
            score = record.avg_val_bpb
            export_trained(model, run_cfg, tokenizer, model_dir, name=name, how=how, avg_bpb=score)

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
        on_model=keep_final,
    )


def model_folder_name(body: str) -> str:
    """The folder an adapted body's model is written to: "STD τ=0.3 body" -> std-0.3-body."""
    return re.sub(r"[^a-z0-9.]+", "-", body.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_to_terminal()
    out = resolve_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    specs = load_sources(resolve_path(args.sources_file))
    held = [s for s in specs if s.name == args.held_out]
    if not held:
        raise SystemExit(f"--held-out {args.held_out!r} is not a source of {args.sources_file}")
    check_source_paths(specs)
    seen = [s for s in specs if s is not held[0]]
    seen_file, held_file = out / "pretrain-sources.yaml", out / "held-out.yaml"
    write_sources(seen_file, seen)
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
    rounds = max(
        1, round(args.tokens / (len(seen) * args.local_steps * args.batch_size * args.seq_len))
    )
    pre = load_config(
        {
            **common,
            "sources-file": str(seen_file),
            "num-server-rounds": rounds,
            "local-steps": args.local_steps,
            "variant": args.variant,
            "output-dir": str(out / "dept-pretrain"),
        }
    )
    started = time.perf_counter()
    print(
        f"pre-training on {len(seen)} sources: {rounds} rounds x {args.local_steps} steps",
        flush=True,
    )
    bodies: dict[str, Any] = {f"DEPT ({args.variant.upper()}) body": pretrain_dept(pre)}
    std = run_standard(
        pre, seen, resolve_path(pre.state_dir), temperature=0.3, sources_per_round=len(seen)
    )
    # The same start for both: where the DEPT body has no ψ (SPEC, SPEC-OPT keep it per
    # source), STD's learned positions are left behind too and both adapt fresh ones.
    dept_body = bodies[f"DEPT ({args.variant.upper()}) body"]
    bodies["STD τ=0.3 body"] = {k: v for k, v in std.body.items() if k in dept_body}
    bodies["fresh body (from scratch)"] = None
    adapt_cfg = load_config({**common, "sources-file": str(held_file), "lr": args.cpt_lr})
    curves = {}
    for name, body in bodies.items():
        folder = out / "models" / model_folder_name(name)
        run = adapt(adapt_cfg, held[0], body, name, args.cpt_steps, args.eval_every, folder)
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
    parser = argparse.ArgumentParser(
        prog="dept cpt", description=plain(__doc__), epilog=EXAMPLES, formatter_class=HelpFormatter
    )
    parser.add_argument("--sources-file", required=True, help="YAML list of sources")
    parser.add_argument("--held-out", required=True, help="the source left out of pre-training")
    parser.add_argument("--model", default="tiny", help="<family>:<size> (see dept models)")
    parser.add_argument(
        "--variant", default="spec-opt", choices=VARIANTS, help="how DEPT pre-trains its body"
    )
    parser.add_argument("--tokens", type=float, default=5e5, help="pre-training tokens per body")
    parser.add_argument("--local-steps", type=int, default=40, help="DEPT's steps per round")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per source per step")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--lr", type=float, default=8e-3, help="pre-training learning rate")
    parser.add_argument(
        "--cpt-lr", type=float, default=8e-3, help="continued pre-training learning rate"
    )
    parser.add_argument(
        "--cpt-steps", type=int, default=200, help="steps on the held-out source per body"
    )
    parser.add_argument("--eval-every", type=int, default=25, help="steps between two validations")
    parser.add_argument("--eval-bytes", type=int, default=12288, help="validation bytes per source")
    parser.add_argument(
        "--global-vocab-size", type=int, default=4096, help="the global tokenizer's size (STD)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the same seed for every run")
    parser.add_argument("--out", default="outputs/cpt", help="folder for the results")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
