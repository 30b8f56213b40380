"""Lists the model families and sizes a run can name, with their parameter counts.

A run's model key names one as <family>:<size> (e.g. gpt2:small), as a bare size (the
default family's, e.g. tiny), or as the path to a Hugging Face config.json of a supported
family (the file, or the folder that holds it). Counts are for the given context length
(learned positions ψ grow with it), vocabulary (a source's embeddings φ are its rows times
the parameters per row) and tying. Every model is built on the meta device, so listing the
1.3b ones takes no memory.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import torch
from rich.console import Console
from rich.table import Table

from dept.cli_help import HelpFormatter, plain
from dept.config import DeptConfig
from dept.model.build import build_model
from dept.model.families import DEFAULT_FAMILY, FAMILIES
from dept.model.roles import (
    body_parameters,
    count_params,
    embedding_parameters,
    position_parameters,
)

PAPER_VOCAB_SIZE = 50_368  # the GPT-NeoX tokenizer the DEPT paper shares across sources
EXAMPLES = f"""examples:
  dept models
  dept models --seq-len 2048 --vocab-size {PAPER_VOCAB_SIZE}   # the paper's setting
  dept models --untied --json
"""


@dataclass(frozen=True)
class CatalogueRow:
    """One preset, as ``dept models`` lists it."""

    model: str
    layers: int
    width: int
    heads: int
    body_params: int  # θ
    position_params: int  # ψ at the given context (0: RoPE)
    params_per_token: int  # φ per vocabulary row: C tied, 2C untied
    embedding_params: int  # φ at the given vocabulary
    total_params: int  # θ + ψ + φ


def catalogue(max_seq_len: int, vocab_size: int, tie: bool = True) -> list[CatalogueRow]:
    """Every family's presets, counted on the model a run builds (on the meta device)."""
    rows = []
    for family in FAMILIES.values():
        for size, dims in family.sizes.items():
            name = f"{family.name}:{size}"
            with torch.device("meta"):
                model = build_model(name, vocab_size, max_seq_len, tie_embeddings=tie)
            body, positions, embeddings = (
                count_params(part(model))
                for part in (body_parameters, position_parameters, embedding_parameters)
            )
            total = body + positions + embeddings
            per_row = dims.hidden_size * (1 if tie else 2)
            dims_ = (dims.num_layers, dims.hidden_size, dims.num_heads)
            rows.append(CatalogueRow(name, *dims_, body, positions, per_row, embeddings, total))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = catalogue(args.seq_len, args.vocab_size, tie=not args.untied)
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
        "vocab_size": args.vocab_size,
        "tie_embeddings": not args.untied,
        "default_family": DEFAULT_FAMILY,
        "models": [asdict(r) for r in rows],
    }


def table(rows: list[CatalogueRow], args: argparse.Namespace) -> Table:
    """One row per preset, parameters in millions (``--json`` has them exactly)."""
    tying = "untied" if args.untied else "tied"
    out = Table(
        title=f"Presets at seq-len {args.seq_len}, vocabulary {args.vocab_size:,}, {tying}",
        caption="parameters in millions: body θ, positions ψ, token embeddings φ",
    )
    columns = ("model", "layers", "width", "heads", "body θ", "ψ", "φ")
    for i, column in enumerate((*columns, "total")):
        out.add_column(column, justify="left" if i == 0 else "right")
    for r in rows:
        counts = (r.body_params, r.position_params, r.embedding_params, r.total_params)
        out.add_row(
            r.model,
            *(f"{n:,}" for n in (r.layers, r.width, r.heads)),
            *(f"{n / 1e6:,.2f}" for n in counts),
        )
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
        "--vocab-size",
        type=int,
        default=DeptConfig.global_vocab_size,
        help="rows of the embeddings φ counted (the run's global-vocab-size by default; "
        f"the paper's GPT-NeoX vocabulary has {PAPER_VOCAB_SIZE:,})",
    )
    parser.add_argument(
        "--untied", action="store_true", help="untied input and output embeddings (φ doubles)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser.parse_args(argv)
