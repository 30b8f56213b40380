"""``dept``: one command for everything a user runs; each subcommand is its module's ``main``.

The subcommand's module is imported only when it runs, so ``dept --help`` and
``dept --version`` answer at once (no torch, no Flower), and the arguments after the
subcommand's name go to that ``main`` untouched: ``dept run --help`` is ``dept-run --help``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from dept.cli_help import HelpFormatter

DISTRIBUTION = "dept-flower"


@dataclass(frozen=True)
class Command:
    """A subcommand: the module whose ``main(argv) -> int`` runs it, and what it does."""

    module: str
    summary: str

    def main(self) -> Callable[[list[str]], int]:
        """The module's ``main``, imported now."""
        return importlib.import_module(self.module).main


COMMANDS: dict[str, Command] = {
    "run": Command("server_app.launch", "run a simulated federation (flwr run, sized for it)"),
    "export": Command("dept_cli.export", "export a finished run as Hugging Face model folders"),
    "eval": Command("dept_cli.evaluate", "a finished run's models through lm-evaluation-harness"),
    "finetune": Command("dept_cli.finetune", "fine-tune a run's models with a task head, per seed"),
    "compare": Command("dept_cli.compare", "every DEPT variant against the baselines, one table"),
    "cpt": Command("dept_cli.cpt", "continued pre-training of DEPT and STD bodies on a new source"),
    "certs": Command("dept.certificates", "TLS certificates and SuperNode keys for a deployment"),
    "models": Command("dept_cli.models", "the model families and sizes, with parameter counts"),
    "prepare": Command("dept_cli.prepare", "tokenize a node's sources ahead of a run"),
    "superexec": Command(
        "dept_cli.superexec", "a node's flower-superexec, its ClientApps started warm (deployment)"
    ),
    "gateway-auth": Command(
        "dept_cli.gateway_auth", "the gateway's check of SuperNode signatures (deployment)"
    ),
}
EXAMPLES = """examples:
  dept run                                  # the default federation, offline
  dept run -c "variant='spec' model='debug'" -c "num-server-rounds=2 output-dir='outputs/spec'"
  dept models
  dept prepare --node-config "source='de' path='/data/de'"   # tokenize before the run
  dept export outputs/dept --source synth-greek --out models/synth-greek
  dept run --help                           # every subcommand has its own help
"""


def installed_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    commands = "\n".join(f"  {name:<13}{c.summary}" for name, c in COMMANDS.items())
    out = argparse.ArgumentParser(
        prog="dept",
        description="DEPT on Flower: federated pre-training with one vocabulary per data source."
        f"\n\ncommands:\n{commands}",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    out.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    out.add_argument("command", choices=COMMANDS, metavar="command", help="see the list above")
    out.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # the list of commands, not argparse's "arguments are required"
        parser().print_help(sys.stderr)
        return 2
    args = parser().parse_args(argv)
    return COMMANDS[args.command].main()(args.args)
