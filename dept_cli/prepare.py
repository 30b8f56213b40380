"""Tokenizes a node's sources ahead of a run, so the first round trains instead of waiting.

It reads what the node's client reads: the run config (the app's pyproject.toml defaults and
``-c`` overrides, as ``dept run``), and the node config of a deployment (``--node-config``,
as given to the SuperNode) or, without one, every source of the run's sources file. Each
source's tokenizer is trained (or found) and its text tokenized into the node's state
directory, under the keys the client looks up; an interrupted preparation continues.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import click

from client_app.node import node_setup, served_sources
from dept.cli_help import HelpFormatter, add_run_config_option, plain
from dept.config import ConfigError, DeptConfig, load_config
from dept.data.sources import SourceSpec
from dept.logs import log_to_terminal
from dept.state.workspace import cache_dir
from dept.train.prepare import PreparedSource, prepare_source
from server_app.config_pairs import parse_pairs
from server_app.launch import absolute_paths, app_defaults, project_dir

ALL_SOURCES = {"partition-id": 0, "num-partitions": 1}  # one simulated node serving every source
EXAMPLES = """examples:
  dept prepare                                        # every source of the default run
  dept prepare -c "sources-file='my-sources.yaml' variant='spec-opt'" --source de-novels
  dept prepare --node-config "source='de' path='/data/de' state-dir='/state'"
"""


@dataclass(frozen=True)
class Prepared:
    """One source made ready, and what it took."""

    spec: SourceSpec
    source: PreparedSource
    seconds: float

    def line(self) -> str:
        tokens = self.source.tokens
        return (
            f"{self.spec.name}: {len(tokens.train):,} training and {len(tokens.validation):,} "
            f"validation tokens ({tokens.train.dtype}) in {self.seconds:.1f} s; "
            f"tokenizer {self.source.tokenizer_file}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dept prepare",
        description=plain(__doc__),
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    add_run_config_option(
        parser, "run config overrides, as for dept run (default: the app's pyproject.toml)"
    )
    parser.add_argument(
        "--node-config",
        default="",
        metavar='"KEY=VALUE ..."',
        help="the SuperNode's node config (source=NAME path=DIR state-dir=... "
        "global-tokenizer=...); default: every source of the run config",
    )
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="NAME",
        help="prepare only this source (repeatable; default: all the node serves)",
    )
    return parser.parse_args(argv)


def run_config(overrides: list[str]) -> DeptConfig:
    """The config a run started with these ``-c`` overrides would have."""
    app = project_dir()
    defaults = app_defaults(app)
    return load_config(defaults, overrides=absolute_paths(parse_pairs(overrides, "-c")))


def prepare_node(
    cfg: DeptConfig, node_config: dict[str, Any], only: list[str] | None = None
) -> list[Prepared]:
    """Prepare the sources the node of ``node_config`` serves (those named in ``only``)."""
    served, _ = served_sources(cfg, node_config)
    names = [s.name for s in served]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise ConfigError(f"--source {', '.join(unknown)}: the node serves {', '.join(names)}")
    done = []
    for name in only or names:
        setup = node_setup(cfg, node_config, name)
        started = time.perf_counter()
        source = prepare_source(
            cfg, setup.spec, cache_dir(setup.state_root), setup.all_sources, setup.global_tokenizer
        )
        done.append(Prepared(setup.spec, source, time.perf_counter() - started))
    return done


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_to_terminal()
    try:
        cfg = run_config(args.run_config)
        node_config = parse_pairs([args.node_config], "--node-config") if args.node_config else {}
        for prepared in prepare_node(
            cfg, node_config or {"partition-id": 0, "num-partitions": 1}, args.source
        ):
            print(prepared.line(), flush=True)
    except (ConfigError, click.ClickException, ValueError, FileNotFoundError) as exc:
        print(f"dept prepare: error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    return 0
