"""Bad nodes against the body: poisoned pseudo-gradients, refused and named, or not.

    python -m benchmarks.comparison.poisoning --sources 8

runs the same federation once honestly and once per attack, in which the culprit's node
(``--culprit``) tampers with every training reply after its honest training:

- ``x1e6``: its pseudo-gradient × 1e6 (well-formed, finite: the size checks' case);
- ``signs-only``: every value ±(the update's own largest |value|): its signs at an honest
  largest size, the magnitudes gone;
- ``reversed``: × −1, the same size, so no size check can see it;
- ``small-flip``: × −0.3, a reversed update smaller than an honest one;
- ``collude``: two nodes, the culprit and the source after it in sorted order, both reversed.

Each runs with the direction check off (``direction-factor`` 0) and on (its default), the
latter labelled ``+direction``. ``--attacks`` also reaches the older ones: ``x1e3``,
``to-max`` (scaled until its largest value is 3.3e38), ``saturated`` (every value ±3.3e38),
``int8-scale`` (``compression=int8``, block scales × 1e30), ``fp16-max`` (``compression=fp16``,
every value ±65504), ``x1e6/reject`` (``outlier-action`` reject) and the honest and reversed
runs combined by ``--robust`` (``honest/trimmed-mean``, ``reversed/trimmed-mean``).

``--sources`` picks the sources:

- 4: the built-in default (the Python standard library and three synthetic languages);
- 8: eight corpora of ``benchmarks/corpora.yaml`` (read in place from ``../shared/corpora``),
  all but ``ja-techdoc``, a translation of ``zh-techdoc``'s manual;
- 16: each of those eight as two sources with no text in common: ``<corpus>-head``, its
  ``train.txt`` (1 MB or so), and ``<corpus>-tail``, its ``val.txt`` (150 KB, the slice
  after the training text), each holding out its own validation lines (5% and 20%). One
  line is one document here (``sample-by: line``), where a corpus folder is read by
  paragraphs: ``ar-quran`` has no blank line and ``ru-chekhov``'s tail four.
  Halves would be fairer, but the source spec has no byte ranges, and ``datasets``' split
  slices (``train[:50%]``) fail in :func:`dept.data.arrow_text.scan` ("hold more than the
  table's rows"); the five built-in sources would make 14. Head and tail share a language
  but no text: every node stays honest and its data its own.

Every run goes through the real ServerApp and ClientApp in process
(:func:`dept_cli.in_process.federate_in_process`). The table has the average validation bits
per byte of the run's honest sources (all but its tampering ones), its change against the
honest run with the same defence setting and against the undefended honest run (so the
``honest+direction`` row is what the defence costs an honest federation), which rounds name
each culprit and by which check, and any honest source named. ``poisoning.json`` adds every
source's figures and, where the check ran, each round's agreements (``agreement``).
Writes ``poisoning.json``/``.csv``/``.txt`` to ``--out``/``<N>-sources``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.comparison.tampers import DEFENDED, Attack, attacks, poisoning
from benchmarks.measure import (
    CORPORA,
    PROJECT,
    common_arguments,
    parse_quick,
    print_table,
    result_header,
    write_outputs,
)
from dept.config import load_config, to_run_config
from dept.data.sources import SourceSpec, load_sources, run_sources, write_sources
from dept.paths import resolve_path
from dept_cli.in_process import federate_in_process, in_process_grid

DEFAULT_ATTACKS = ("honest", "x1e6", "signs-only", "reversed", "small-flip", "collude")
NAMED = ("clipped", "rejected")  # what the summary calls a caught update
CULPRITS = {4: "synth-greek", 8: "ru-chekhov", 16: "ru-chekhov-head"}  # --culprit's default
LEFT_OUT = "ja-techdoc"  # of the nine corpora: the same manual as zh-techdoc, translated
PARTS = (("head", "train.txt", 0.05), ("tail", "val.txt", 0.2))  # name, file, val-fraction
# what the reason of a named update says, by check (the rest are the size checks')
CHECKS = {"direction-factor": "direction", "flatness-factor": "flatness"}
FLATNESS = 2.5  # the flatness check, on in every run here (signs-only is its attack)
CODE = ("dept", "dept_strategy", "server_app", "client_app", "pyproject.toml")  # what ran


def culprits(names: list[str], culprit: str, count: int) -> list[str]:
    """``culprit`` and the ``count`` − 1 sources after it in sorted order (wrapping round)."""
    order = sorted(names)
    if culprit not in order:
        raise SystemExit(f"--culprit {culprit!r} is not a source of this run: {order}")
    start = order.index(culprit)
    return [order[(start + k) % len(order)] for k in range(count)]


def head_and_tail(spec: SourceSpec) -> list[SourceSpec]:
    """A corpus folder as two sources with no text in common (see the module docstring)."""
    return [
        SourceSpec(
            name=f"{spec.name}-{part}",
            path=str(Path(spec.path) / file),
            vocab_size=spec.vocab_size,
            val_fraction=fraction,
            sample_by="line",
        )
        for part, file, fraction in PARTS
    ]


def sources_file(count: int, work: Path) -> str:
    """The run's ``sources-file``: empty for the built-in four, else one written in ``work``."""
    if count == 4:
        return ""
    corpora = [s for s in load_sources(CORPORA) if s.name != LEFT_OUT]
    specs = corpora if count == 8 else [p for s in corpora for p in head_and_tail(s)]
    path = work / "sources.yaml"
    write_sources(path, specs)
    return str(path)


def run_attack(
    base: dict[str, Any], label: str, attack: Attack, pair: list[str], work: Path
) -> dict[str, Any]:
    """One federation under ``attack``, its first ``attack.nodes`` sources of ``pair`` bad."""
    out_dir = work / "runs" / label.replace("/", "-")
    shutil.rmtree(out_dir, ignore_errors=True)  # a fresh run, not a resume of an old one
    config = {
        **base,
        "compression": attack.compression,
        "aggregation": attack.aggregation,
        "outlier-action": attack.outlier_action,
        "output-dir": str(out_dir),
    }
    if not attack.direction:
        config["direction-factor"] = 0.0
    bad = pair[: attack.nodes] if attack.tamper is not None else []
    grid = in_process_grid(config)
    if attack.tamper is not None:
        grid.client_app = poisoning(grid.client_app, bad, attack.tamper)
    started = time.perf_counter()
    out = federate_in_process(config, grid)
    summary = json.loads((out / "summary.json").read_text())
    named = [p for p in summary["problems"] if p["kind"] in NAMED]
    return {
        "attack": label,
        "direction_factor": config["direction-factor"],
        "aggregation": attack.aggregation,
        "outlier_action": attack.outlier_action,
        "compression": attack.compression,
        "culprits": bad,
        "wall_s": time.perf_counter() - started,
        "avg_val_bpb": summary["avg_val_bpb"],
        "named": {c: _naming(named, c) for c in bad},
        "honest_named": [p for p in named if p.get("source") not in bad],
        "other_problems": sum(p.get("source") not in bad for p in summary["problems"]),
        "tokens_credited": {c: summary["sources"][c]["tokens_trained"] for c in bad},
        "sources": {n: s["val_bpb"] for n, s in summary["sources"].items()},
        "agreement": _agreements(out / "metrics.jsonl"),
    }


def _naming(named: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """In which rounds ``source`` was named, by which check, and the first reason."""
    against = [p for p in named if p.get("source") == source]
    return {
        "rounds": sorted({p["round"] for p in against}),
        "checks": sorted({_check(p["reason"]) for p in against}),
        "reason": against[0]["reason"] if against else "",
    }


def _check(reason: str) -> str:
    """Which check named an update, by the config key its reason names."""
    return next((check for key, check in CHECKS.items() if key in reason), "size")


def code_version() -> dict[str, Any]:
    """The commit the server and client code is at, and its files changed since: the
    defences are still being tuned, and a table holds only for the code it ran on."""
    git = ["git", "-C", str(PROJECT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--", *CODE], capture_output=True, text=True
    )
    return {"commit": head.stdout.strip(), "changed": changed.stdout.splitlines()}


def _agreements(metrics: Path) -> dict[int, dict[str, float]]:
    """Per round, each source's agreement with the others (recorded where the check ran)."""
    rounds = (json.loads(line) for line in metrics.read_text().splitlines() if line.strip())
    return {r["round"]: r["agreement"] for r in rounds if r.get("agreement")}


def honest_average(row: dict[str, Any], reference: dict[str, Any] | None = None) -> float:
    """The average bits per byte of ``row``'s honest sources, in ``reference``'s run
    (default: its own), so two runs compare over the same sources."""
    run = reference or row
    honest = [n for n in row["sources"] if n not in row["culprits"]]
    return sum(run["sources"][n] for n in honest) / len(honest)


def change(row: dict[str, Any], reference: dict[str, Any] | None) -> float:
    """% change of ``row``'s honest sources against ``reference`` (NaN where it did not run)."""
    if reference is None:
        return math.nan
    before = honest_average(row, reference)
    return 100 * (honest_average(row) - before) / before


def _who(row: dict[str, Any]) -> tuple[str, str]:
    """(the rounds naming each culprit, by which checks) as table cells."""
    named = row["named"]
    if not named:
        return "—", ""
    rounds = {c: ", ".join(map(str, n["rounds"])) or "none" for c, n in named.items()}
    cell = (
        rounds[row["culprits"][0]]
        if len(named) == 1
        else "; ".join(f"{c}: {r}" for c, r in rounds.items())
    )
    checks = sorted({check for n in named.values() for check in n["checks"]})
    return cell, "+".join(checks)


def _flagged(row: dict[str, Any]) -> str:
    found = [f"{p['source']} r{p['round']} ({_check(p['reason'])})" for p in row["honest_named"]]
    return ", ".join(found) or "none"


def summarise(
    args: argparse.Namespace, pair: list[str], rows: list[dict[str, Any]], code: dict[str, Any]
) -> dict[str, Any]:
    by_label = {r["attack"]: r for r in rows}
    honest = {
        (r["aggregation"], r["direction_factor"] > 0): r
        for r in rows
        if r["attack"].startswith("honest")
    }

    def same(r: dict[str, Any]) -> float:
        return change(r, honest.get((r["aggregation"], r["direction_factor"] > 0)))

    def undefended(r: dict[str, Any]) -> float:
        return change(r, honest.get((r["aggregation"], False)))

    table = print_table(
        f"bad nodes ({pair[0]}; colluding, {pair[1]} too) among {args.sources} sources: "
        f"the honest sources' average validation bits per byte after {args.rounds} rounds "
        f"x {args.local_steps} steps ({args.model})",
        [
            "attack",
            "honest sources",
            "their avg bpb",
            "Δ % vs the honest run, same defence",
            "Δ % vs the honest run, no defence",
            "culprit named in rounds",
            "by",
            "honest sources named",
        ],
        [
            (
                r["attack"],
                len(r["sources"]) - len(r["culprits"]),
                honest_average(r),
                same(r),
                undefended(r),
                *_who(r),
                _flagged(r),
            )
            for r in rows
        ],
    )
    defended = [r for r in rows if r["culprits"] and r["direction_factor"] > 0]
    reversed_ = by_label.get("reversed" + DEFENDED)
    honest_on = by_label.get("honest" + DEFENDED)
    return {
        **result_header("poisoning", args, args.threads),
        "code": code,
        "table": table,
        "reversed_defended_change_percent": same(reversed_) if reversed_ else math.nan,
        "defence_change_percent": undefended(honest_on) if honest_on else math.nan,
        "every_defended_culprit_named": all(
            n["rounds"] for r in defended for n in r["named"].values()
        ),
        "honest_sources_named": sum(len(r["honest_named"]) for r in rows),
    }


def base_config(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The run config every run of this source count shares."""
    return to_run_config(
        load_config(
            {
                "model": args.model,
                "num-server-rounds": args.rounds,
                "local-steps": args.local_steps,
                "warmup-steps": min(10, args.rounds * args.local_steps - 1),
                "eval-bytes": args.eval_bytes,
                "sources-file": sources_file(args.sources, work),
                # off by default (a source restarting with fresh AdamW state is flat too)
                "flatness-factor": FLATNESS,
                "state-dir": str(work.parent / "state"),
                "device": "cpu",
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    code = code_version()  # before the first run imports the server and client code
    torch.set_num_threads(args.threads)
    work = resolve_path(str(args.work)) / f"{args.sources}-sources"
    work.mkdir(parents=True, exist_ok=True)
    base = base_config(args, work)
    catalogue = attacks(args.robust)
    unknown = sorted(set(args.attacks) - catalogue.keys())
    if unknown:
        raise SystemExit(f"unknown attack(s) {unknown}; known: {', '.join(catalogue)}")
    pair = culprits([s.name for s in run_sources(load_config(base))], args.culprit, 2)
    rows = []
    for label in args.attacks:
        rows.append(run_attack(base, label, catalogue[label], pair, work))
        named = {c: n["rounds"] for c, n in rows[-1]["named"].items()}
        print(
            f"{label}: honest avg val bpb {honest_average(rows[-1]):.4f}, named {named}, "
            f"honest sources named {len(rows[-1]['honest_named'])} ({rows[-1]['wall_s']:.0f} s)",
            flush=True,
        )
    out = args.out / f"{args.sources}-sources"
    write_outputs(out, "poisoning", summarise(args, pair, rows, code), rows)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(parser, "poisoning", "debug model, 2 rounds x 4 steps")
    parser.add_argument("--sources", type=int, default=4, choices=sorted(CULPRITS))
    parser.add_argument("--culprit", help="the source that tampers (default: one per --sources)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-steps", type=int, default=25)
    parser.add_argument("--eval-bytes", type=int, default=32768)
    parser.add_argument("--robust", default="trimmed-mean", choices=["trimmed-mean", "median"])
    parser.add_argument(
        "--attacks",
        type=lambda s: s.split(","),
        default=[a + s for a in DEFAULT_ATTACKS for s in ("", DEFENDED)],
        help="labels, comma-separated (default: the six, each without and with +direction)",
    )
    quick = {"model": "debug", "rounds": 2, "local_steps": 4, "eval_bytes": 4096}
    args = parse_quick(parser, argv, **quick)
    args.culprit = args.culprit or CULPRITS[args.sources]
    return args


if __name__ == "__main__":
    raise SystemExit(main())
