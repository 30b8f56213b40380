"""-c and --node-config strings: a pair that does not read is named with its fix, and every
such string the help texts and docs show reads as printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dept.config import ConfigError
from server_app.config_pairs import pairs_text, parse_pairs

ROOT = Path(__file__).resolve().parents[2]
# python -c "..." is Python, not a run config; the string may follow a line continuation
EXAMPLE = re.compile(
    r"""(?<!python )(?<!python3 )(?:-c|--run-config|--node-config)(?: |\\\n)+"([^"]*)\""""
)
PLACEHOLDERS = ("...", "KEY", "key=value", "CELL-SETTINGS", "${")
SHELL_VARIABLES = {"$PWD": "/home/me/dept"}  # as the shell expands them before flwr reads


def test_a_bare_string_is_named_with_its_quoted_form() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_pairs(["source=de path='/data/de' vocab-size=4096"], "--node-config")
    message = str(refused.value)
    assert message.startswith("--node-config: source=de: a string needs quotes, source='de'")
    assert "path=" not in message and "vocab-size" not in message, "only the bad pair"


def test_pairs_that_read_are_returned_as_flower_reads_them() -> None:
    assert parse_pairs(["variant='spec' lr=0.01 resume=true"], "-c") == {
        "variant": "spec",
        "lr": 0.01,
        "resume": True,
    }


def _examples() -> list[tuple[str, str]]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += [*sorted((ROOT / "dept_cli").glob("*.py")), ROOT / "server_app" / "launch.py"]
    found = []
    for path in files:
        for text in EXAMPLE.findall(path.read_text()):
            if "=" in text and not any(mark in text for mark in PLACEHOLDERS):
                for variable, value in SHELL_VARIABLES.items():
                    text = text.replace(variable, value)
                found.append((path.relative_to(ROOT).as_posix(), text.replace("\\'", "'")))
    return found


def test_every_config_string_the_help_and_docs_show_reads_as_printed() -> None:
    examples = _examples()
    assert len(examples) > 20, "the pattern still finds the examples"
    shown = {text for _, text in examples}
    assert any("output-dir='/home/me/dept/outputs/flwr'" in t for t in shown), "$PWD expanded"
    assert any("model='small' num-server-rounds=50" in t for t in shown), "after a line break"
    for where, text in examples:
        try:
            parse_pairs([text], "-c")
        except ConfigError as exc:
            pytest.fail(f"{where}: {text!r}: {exc}")


def test_pairs_written_read_back_as_they_were() -> None:
    pairs = {"source": "it's here", "rounds": 3, "share": 0.25, "tie": False, "path": "/a b/c"}

    assert parse_pairs([pairs_text(pairs)], "--node-config") == pairs
