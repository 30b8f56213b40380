"""Lists the model families and sizes a run can name, with their parameter counts.

A run's model key names one as <family>:<size> (e.g. gpt2:small), as a bare size (the
default family's, e.g. tiny), or as the path to a Hugging Face config.json of a supported
family (the file, or the folder that holds it). Counts are for the given context length
(learned positions ψ grow with it) and tying; a source's embeddings φ are its vocabulary's
rows times the parameters per row.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from rich.console import Console
from rich.table import Table

from dept.cli_help import HelpFormatter, plain
from dept.config import DeptConfig
from dept.model import DEFAULT_FAMILY, FAMILIES, CatalogueRow, catalogue

EXAMPLES = """examples:
  dept models
  dept models --seq-len 2048 --untied
  dept models --json
"""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = catalogue(args.seq_len, tie=not args.untied)
    if args.json:
        print(json.dumps(as_json(rows, args), indent=2))
    else:
        Console().print(table(rows, args))
        print(naming())
    return 0


def as_json(rows: list[CatalogueRow], args: argparse.Namespace) -> dict:
    """The table's numbers and what they were counted for."""
    return {
        "seq_len": args.seq_len,
        "tie_embeddings": not args.untied,
        "default_family": DEFAULT_FAMILY,
        "models": [asdict(r) for r in rows],
    }


def table(rows: list[CatalogueRow], args: argparse.Namespace) -> Table:
    """One row per preset, counts with thousands separators."""
    tying = "untied" if args.untied else "tied"
    out = Table(title=f"Model presets at seq-len {args.seq_len}, {tying} embeddings")
    for i, column in enumerate(
        ("model", "layers", "width", "heads", "body θ", "positions ψ", "φ per row")
    ):
        out.add_column(column, justify="left" if i == 0 else "right")
    for r in rows:
        numbers = (r.layers, r.width, r.heads, r.body_params, r.position_params, r.params_per_token)
        out.add_row(r.model, *(f"{n:,}" for n in numbers))
    return out


def naming() -> str:
    """How a run names a model (printed under the table)."""
    return (
        f"Name a model as <family>:<size> (families: {', '.join(FAMILIES)}), as a bare size\n"
        f"(a {DEFAULT_FAMILY} one), or as a path to a Hugging Face config.json: "
        "dept run -c \"model='gpt2:small'\""
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dept models",
        description=plain(__doc__),
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        default=DeptConfig.seq_len,
        help="context length (learned positions ψ grow with it)",
    )
    parser.add_argument(
        "--untied", action="store_true", help="untied input and output embeddings (φ doubles)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser.parse_args(argv)
