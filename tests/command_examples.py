"""Every command example a user is shown: the README's and docs' shell blocks, and the
examples in each command's ``--help``; each by its first line, as printed.

``tests/test_command_examples.py`` holds each one to the test that runs it as printed, or to
the reason no test in CI can.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from dept_cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```$", re.S | re.M)
HEREDOC = re.compile(r"<<-?'?(\w+)'?")
# the modules whose ``--help`` ends with examples: ``dept`` and each of its commands
HELP = ["dept_cli.main", *(command.module for command in COMMANDS.values())]


def block_commands(block: str) -> list[str]:
    """The commands of a shell block: continued lines joined, comments dropped, a here
    document kept with the command that reads it (the command's first line names it)."""
    commands: list[str] = []
    lines = iter(block.replace("\\\n", " ").splitlines())
    for line in lines:
        command = line.split(" #")[0].strip()
        if not command or command.startswith("#"):
            continue
        heredoc = HEREDOC.search(command)
        if heredoc:
            for body in lines:  # the document's lines belong to this command
                if body.strip() == heredoc.group(1):
                    break
        commands.append(re.sub(r"\s+", " ", command))
    return commands


def doc_examples() -> dict[str, str]:
    """Each docs command, as printed, and where it is (file and heading)."""
    found: dict[str, str] = {}
    for doc in DOCS:
        text = doc.read_text()
        for block in SHELL_BLOCK.finditer(text):
            headings = re.findall(r"^#+ (.*)$", text[: block.start()], re.M)
            where = f"{doc.relative_to(ROOT)}: {headings[-1] if headings else ''}"
            for command in block_commands(block.group(1)):
                found.setdefault(command, where)
    return found


def help_examples() -> dict[str, str]:
    """Each ``--help`` example, as printed (continued lines joined), and the module whose
    help shows it: the examples that end a text constant of the module."""
    found: dict[str, str] = {}
    for module in HELP:
        texts = [v for v in vars(importlib.import_module(module)).values() if isinstance(v, str)]
        (text,) = [t for t in texts if "examples:\n" in t]
        examples = text[text.index("examples:") :].replace("\\\n", " ").splitlines()[1:]
        for line in examples:
            command = line.split(" #")[0].strip()
            if command.startswith("dept "):
                found.setdefault(re.sub(r"\s+", " ", command), f"{module} --help")
    return found


def all_examples() -> dict[str, str]:
    return {**help_examples(), **doc_examples()}
