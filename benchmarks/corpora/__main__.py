"""Build a corpus set from pinned packages::

    python -m benchmarks.corpora build-english OUT             # eight English domains
    python -m benchmarks.corpora build-english OUT --check     # and hold them to the pins
    python -m benchmarks.corpora build-tasks OUT --sources-file benchmarks/corpora.yaml
                                          # downstream tasks from held-out text (dept finetune)

The packages are kept in ``--cache`` (default ``OUT/.packages``); only the package
registries (Debian, npm) need to be reachable. The committed manifest
(``benchmarks/corpora/english-manifest.json``) pins every package and output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.corpora.english import MANIFEST, TRAIN_BYTES, build
from benchmarks.corpora.tasks import TASKS, build_tasks

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
    tasks = commands.add_parser("build-tasks", help="downstream tasks for dept finetune")
    tasks.add_argument("out", type=Path)
    tasks.add_argument("--sources-file", type=Path, required=True)
    tasks.add_argument("--train", type=int, default=2000, help="examples per task")
    tasks.add_argument("--test", type=int, default=500, help="examples per task")
    tasks.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "build-tasks":
        build_tasks(args.sources_file, args.out, train=args.train, test=args.test, seed=args.seed)
        print(f"wrote {', '.join(TASKS)} and tasks.json under {args.out}")
        return 0
    pins = json.loads(PINS.read_text()) if args.check else None
    build(args.out, args.cache or args.out / ".packages", train_bytes=args.train_bytes, pins=pins)
    print(f"wrote {args.out / MANIFEST} and {args.out / 'sources.yaml'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
