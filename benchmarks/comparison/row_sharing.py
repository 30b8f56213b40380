"""How private is each source's vocabulary under the global tokenizer, and does it explain GLOB?

GLOB averages the whole embedding matrix φ over the sources every round. A row that only one
source's text uses gets that source's update divided by the number of sources (the others send
next to nothing for it, or, with tied embeddings, push it down through the softmax), so a
source whose tokens live on such rows learns its embeddings many times slower than under STD,
where the same row takes a full AdamW step. TRIM averages each row only over the sources that
hold it. This measures, per source, the share of its training tokens on rows no other source
uses, and, given comparison or ablation results, each method's per-source gap to STD τ=0 and
its correlation with that share::

    python -m benchmarks.comparison.row_sharing \
        --results benchmarks/results/compare-tiny-nine/comparison.json

Writes ``row_sharing.json`` and ``row_sharing.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from dept.config import load_config
from dept.data.sources import run_sources
from dept.paths import resolve_path
from dept.state.strict_json import dumps
from dept.state.workspace import cache_dir
from dept.train.prepare import prepare_source

REFERENCE = "std-0"


def token_ids(sources_file: Path, vocab_size: int, state_dir: Path) -> dict[str, np.ndarray]:
    """Each source's training token ids under the global tokenizer of ``vocab_size`` that a
    comparison trains (the same sources, seed 0), its cache kept in ``state_dir``. A source's
    own vocab-size plays no part: GLOB's ids are the global tokenizer's."""
    cfg = load_config(
        {
            "sources-file": str(sources_file),
            "variant": "glob",
            "global-vocab-size": vocab_size,
            "state-dir": str(state_dir),
        }
    )
    specs = run_sources(cfg)
    cache = cache_dir(state_dir)
    return {s.name: np.asarray(prepare_source(cfg, s, cache, specs).tokens.train) for s in specs}


def private_shares(ids: dict[str, np.ndarray], vocab_size: int) -> dict[str, float]:
    """Per source: the fraction of its tokens on rows that no other source's tokens use."""
    users = np.zeros(vocab_size, dtype=np.int64)
    for stream in ids.values():
        users[np.unique(stream)] += 1
    return {name: float((users[stream] == 1).mean()) for name, stream in ids.items()}


def gaps(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per method: each source's final bits per byte relative to STD τ=0's, in percent."""
    std = results[REFERENCE]["sources"]
    return {
        method: {
            name: (run["sources"][name]["val_bpb"] / std[name]["val_bpb"] - 1) * 100 for name in std
        }
        for method, run in results.items()
        if method != REFERENCE and "sources" in run
    }


def render(shares: dict[str, float], by_method: dict[str, dict[str, float]]) -> str:
    methods = list(by_method)
    lines = [
        "# Private embedding rows and each method's gap to STD τ=0",
        "",
        "| source | tokens on rows only it uses | "
        + " | ".join(f"{m} vs STD τ=0" for m in methods)
        + " |",
        "|" + "---|" * (len(methods) + 2),
    ]
    for name, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        cells = " | ".join(f"{by_method[m][name]:+.1f}%" for m in methods)
        lines.append(f"| {name} | {share:.2f} | {cells} |")
    x = np.array([shares[n] for n in shares])
    corr = [np.corrcoef(x, [by_method[m][n] for n in shares])[0, 1] for m in methods]
    lines.append("| correlation with the share | | " + " | ".join(f"{c:.2f}" for c in corr) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.comparison.row_sharing", description=__doc__
    )
    parser.add_argument("--sources-file", default="benchmarks/corpora.yaml")
    parser.add_argument("--vocab-size", type=int, default=4096, help="the global tokenizer's")
    parser.add_argument("--results", default="benchmarks/results/compare-tiny-nine/comparison.json")
    parser.add_argument("--out", default="outputs/row-sharing")
    args = parser.parse_args(argv)
    out = resolve_path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ids = token_ids(resolve_path(args.sources_file), args.vocab_size, out / "state")
    shares = private_shares(ids, args.vocab_size)
    results = json.loads(Path(args.results).read_text())["methods"]
    by_method = gaps(results)
    (out / "row_sharing.json").write_text(
        dumps({"private_share": shares, "gap_vs_std_percent": by_method}, indent=2)
    )
    (out / "row_sharing.md").write_text(render(shares, by_method))
    print((out / "row_sharing.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
