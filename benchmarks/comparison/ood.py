"""Out-of-distribution bits per byte (issue #32, the paper's mC4 row): each method's body from
a comparison, scored on a source that no run of it trained on.

    python -m benchmarks.corpora build-english ~/english        # sources-ood.yaml, held-out.yaml
    dept compare --sources-file ~/english/sources-ood.yaml ... --out outputs/compare-english-4x
    python -m benchmarks.comparison.ood --comparison outputs/compare-english-4x \\
        --held-out ~/english/held-out.yaml --out benchmarks/results/english-ood

For each method, its best rate's run (the comparison's ``methods``), in two columns:

- **zero-shot**, where the body comes with a tokenizer and embeddings for any text: STD and ACT
  with the run's model, GLOB and TRIM with the global model (θ, the server's φ, the global
  tokenizer). The held-out source's validation text is scored through lm-evaluation-harness,
  as ``dept eval`` scores a run's own sources. SPEC and SPEC-OPT have no such model: blank;
- **after CPT**, for every method and for a fresh body beside them: the body gets fresh
  embeddings for the held-out source's own tokenizer and trains on its training text for
  ``--cpt-steps`` (``dept cpt``'s :func:`dept_cli.cpt.adapt`, at ``--cpt-lr``), then is scored
  on its validation text. The same steps for all, so the column compares bodies, not
  tokenizers.

Writes ``ood.json``, ``ood.csv``, ``ood.txt`` and ``ood.png`` to ``--out``. Models and CPT
runs go under ``--work``. ``--methods`` scores a subset; rows an earlier invocation left in
``--out`` for the same comparison, held-out source and CPT are kept, so a comparison that runs
over several sessions is scored method by method as its sweeps finish.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from benchmarks.measure import print_table, result_header, write_outputs
from dept.config import ConfigError, DeptConfig, load_config
from dept.data.corpus import load_source_text
from dept.data.sources import SourceSpec, load_sources
from dept.export import export_global, load_run
from dept.logs import log_to_terminal
from dept.model.variants import variant
from dept.paths import resolve_path
from dept_cli.compare_resume import PLAN_FILE
from dept_cli.cpt import adapt
from dept_cli.evaluate import BASELINE_MODEL
from dept_cli.harness import evaluate_folder, stream_task, validation_stream
from dept_cli.seeds import run_folder

log = logging.getLogger("ood")
NAME = "ood"
FRESH = "fresh body"


def best_runs(comparison: Path, methods: list[str] | None) -> dict[str, tuple[float, Path]]:
    """Each method's best rate and its run folder, as the comparison chose them; only
    ``methods`` where given."""
    report = json.loads((comparison / "comparison.json").read_text())
    base_seed = int(report["config"]["seed"])
    best = {}
    for method, row in report["methods"].items():
        if row.get("failed") or row.get("error"):
            continue
        lr = float(row["lr"])
        best[method] = (lr, comparison / "runs" / run_folder(method, lr, base_seed, base_seed))
    if not best:
        raise ConfigError(f"{comparison}/comparison.json names no finished method")
    unknown = sorted(set(methods or ()) - set(best))
    if unknown:
        raise ConfigError(
            f"--methods {','.join(unknown)}: not a finished method of {comparison}/comparison.json"
            f" (it has {','.join(best)})"
        )
    return {m: run for m, run in best.items() if not methods or m in methods}


KEPT_IF_SAME = ("comparison", "held_out", "cpt_steps", "cpt_lr")  # what makes rows comparable


def earlier_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows ``--out`` already holds, where they scored the same comparison's bodies on the
    same held-out source with the same CPT; none otherwise."""
    try:
        earlier = json.loads((args.out / f"{NAME}.json").read_text())
    except (OSError, ValueError):
        return []
    now = result_header(NAME, args, None)["settings"]
    changed = [k for k in KEPT_IF_SAME if earlier["settings"].get(k) != now[k]]
    if changed:
        log.info("not keeping %s/%s.json's rows: its %s differ", args.out, NAME, changed)
        return []
    return list(earlier["runs"])


def zero_shot_model(run_dir: Path, work: Path) -> Path | None:
    """The model that scores any text with the run's body: the baseline's own, GLOB's and
    TRIM's global model; None for SPEC and SPEC-OPT."""
    if (run_dir / BASELINE_MODEL / "config.json").is_file():
        return run_dir / BASELINE_MODEL
    run = load_run(run_dir)
    if not variant(run.cfg.variant).shares_embeddings:
        return None
    folder = work / "models" / run_dir.name
    export_global(run_dir, folder, force=True)
    return folder


def body_of(run_dir: Path) -> dict[str, torch.Tensor]:
    """θ (and learned positions where the run has them) that a run ends with."""
    if (run_dir / BASELINE_MODEL / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        from dept.model.roles import body_state, position_state

        model = AutoModelForCausalLM.from_pretrained(run_dir / BASELINE_MODEL)
        return body_state(model) | position_state(model)
    return load_run(run_dir).body


def score(folder: Path, spec: SourceSpec, cfg: DeptConfig, work: Path) -> float:
    """Bits per byte of the model in ``folder`` on ``spec``'s validation text (lm-eval)."""
    from transformers import AutoTokenizer

    text = load_source_text(spec, work / "cache", cfg.seed)
    eos = AutoTokenizer.from_pretrained(folder).eos_token
    stream = validation_stream(spec.name, text.validation["text"], eos, cfg.eval_bytes)
    task = stream_task(stream, work / "data" / folder.name)
    results = evaluate_folder(folder, [task], seq_len=cfg.seq_len, device="cpu", batch_size=8)
    return float(next(iter(results.values()))["bits_per_byte"])


def cpt_config(run_dir: Path, held_out: Path, args: argparse.Namespace) -> DeptConfig:
    """The run's config, retargeted at the held-out source for CPT."""
    planned = json.loads((run_dir / PLAN_FILE).read_text())
    return load_config(
        {
            **planned,
            "sources-file": str(held_out),
            "state-dir": str(args.work / "state"),
            "output-dir": str(args.work / "out"),
            "lr": args.cpt_lr,
            "device": "cpu",
        }
    )


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per method (and the fresh body): zero-shot and after-CPT bits per byte; the
    earlier rows of methods not measured now, kept, and the fresh body measured once."""
    [spec] = load_sources(args.held_out)
    runs = best_runs(args.comparison, args.methods)
    first = next(iter(runs.values()))[1]
    cfg = cpt_config(first, args.held_out, args)
    report = json.loads((args.comparison / "comparison.json").read_text())["methods"]
    kept = [r for r in earlier_rows(args) if r["method"] not in runs]
    todo = [*runs.items()] + [(FRESH, (0.0, first))] * all(r["method"] != FRESH for r in kept)
    rows = []
    for method, (lr, run_dir) in todo:
        row: dict[str, Any] = {"method": method, "lr": lr}
        fresh = method == FRESH
        row["in_distribution_bpb"] = None if fresh else _average(report[method]["sources"])
        model = None if fresh else zero_shot_model(run_dir, args.work)
        row["zero_shot_bpb"] = score(model, spec, cfg, args.work) if model else None
        body = None if fresh else body_of(run_dir)
        folder = args.work / "cpt" / method
        run = adapt(cfg, spec, body, method, args.cpt_steps, args.cpt_steps, folder)
        row["cpt_bpb"] = run.rounds[-1].avg_val_bpb
        row["cpt_tokens"] = run.tokens_trained
        log.info("%s: %s", method, row)
        rows.append(row)
    order = {method: i for i, method in enumerate([*report, FRESH])}
    return sorted(kept + rows, key=lambda r: order.get(r["method"], len(order)))


def _average(sources: dict[str, dict[str, float]]) -> float:
    return sum(s["val_bpb"] for s in sources.values()) / len(sources)


def plot(out: Path, rows: list[dict[str, Any]], held_out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r["method"] for r in rows]
    for offset, key, label in ((-0.2, "zero_shot_bpb", "zero-shot"), (0.2, "cpt_bpb", "after CPT")):
        values = [r[key] if r[key] is not None else float("nan") for r in rows]
        ax.bar([i + offset for i in range(len(rows))], values, width=0.4, label=label)
    ax.set_xticks(range(len(rows)), names, rotation=30)
    ax.set_ylabel(f"{held_out} validation bits per byte")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{NAME}.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_to_terminal()
    [spec] = load_sources(args.held_out)
    try:
        rows = measure(args)
    except ConfigError as error:
        raise SystemExit(f"ood: {error}") from None
    columns = ("method", "lr", "in-distribution", "zero-shot", "after CPT")
    keys = ("lr", "in_distribution_bpb", "zero_shot_bpb", "cpt_bpb")
    table = [[r["method"], *(r[k] if r[k] else float("nan") for k in keys)] for r in rows]
    title = f"bits per byte on held-out {spec.name}: zero-shot, after {args.cpt_steps} CPT steps"
    text = print_table(title, columns, table)
    result = {**result_header(NAME, args, torch.get_num_threads()), "table": text}
    write_outputs(args.out, NAME, result, rows)
    plot(args.out, rows, spec.name)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comparison", type=Path, required=True, help="a dept compare --out")
    parser.add_argument("--held-out", type=Path, required=True, help="sources file of one source")
    parser.add_argument(
        "--methods",
        type=lambda text: text.split(","),
        help="comma-separated methods of the comparison to score (default: all); rows --out "
        "holds for others are kept",
    )
    parser.add_argument("--cpt-steps", type=int, default=100, help="CPT steps for every body")
    parser.add_argument("--cpt-lr", type=float, default=0.002, help="CPT's learning rate")
    parser.add_argument("--work", type=Path, default=Path("outputs/ood"), help="models, CPT runs")
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{NAME}"))
    args = parser.parse_args(argv)
    args.comparison, args.held_out = resolve_path(args.comparison), resolve_path(args.held_out)
    args.work, args.out = resolve_path(args.work), resolve_path(args.out)
    held = load_sources(args.held_out)
    if len(held) != 1:
        parser.error(f"--held-out {args.held_out} lists {len(held)} sources; give one")
    return args


if __name__ == "__main__":
    raise SystemExit(main())
