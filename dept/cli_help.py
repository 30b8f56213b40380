"""How every ``dept`` command lays out its ``--help``: plain text, examples as written, defaults.

Here, not in ``dept_cli``, because the core's own commands (``dept export``, ``dept certs``)
use it too, and the core imports nothing above it.
"""

from __future__ import annotations

import argparse
import re

ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :mod:`dept.model.variants` -> dept.model.variants


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's and the epilog's line breaks (one example a line) and appends
    ``(default: ...)`` to every option whose default says something (not None, off or empty)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "%(default)" in text or not action.option_strings or not _worth_showing(action):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def add_run_config_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--run-config``/``-c``, repeatable, as ``flwr run`` spells it: every command that
    takes run config overrides takes them the same way."""
    parser.add_argument(
        "--run-config",
        "-c",
        action="append",
        default=[],
        metavar='"KEY=VALUE ..."',
        help=help_text,
    )


def _worth_showing(action: argparse.Action) -> bool:
    default = action.default  # ``in (None, False, ...)`` would also drop a default of 0
    return not (default is None or default is False or default in ("", [], argparse.SUPPRESS))


def plain(docstring: str | None) -> str:
    """A module's docstring as its command's description: without the reST markup."""
    return ROLE.sub(r"\1", docstring or "").replace("``", "").strip()
