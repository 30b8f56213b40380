"""``dept export``: a finished run's models as Hugging Face folders (the library is
:mod:`dept.export`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dept.cli_help import HelpFormatter
from dept.export import export_global, export_source

EXAMPLES = """examples:
  dept export outputs/dept --source de-novels --out models/de-novels   # any variant
  dept export outputs/dept --global --out models/global                # glob, trim
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dept export",
        description="Export a finished DEPT run as Hugging Face model folders that load offline.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("run_dir", type=Path, help="the run's output-dir")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--source", help="export this source's model")
    which.add_argument(
        "--global",
        dest="global_model",
        action="store_true",
        help="export the global model (glob, trim)",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to write")
    parser.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    parser.add_argument("--state-dir", type=Path, help="the source's state root, if not the run's")
    parser.add_argument("--sources-file", type=Path, help="sources file, if not the run's")
    parser.add_argument(
        "--global-tokenizer", type=Path, help="the run's global tokenizer.json (deployed node)"
    )
    args = parser.parse_args(argv)
    try:
        if args.global_model:
            out = export_global(
                args.run_dir,
                args.out,
                state_dir=args.state_dir,
                global_tokenizer_file=args.global_tokenizer,
                force=args.force,
            )
        else:
            out = export_source(
                args.run_dir,
                args.source,
                args.out,
                state_dir=args.state_dir,
                sources_file=args.sources_file,
                global_tokenizer_file=args.global_tokenizer,
                force=args.force,
            )
    except (ValueError, OSError) as exc:  # ConfigError is a ValueError
        parser.exit(2, f"{parser.prog}: {exc}\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
