"""The ``dept`` dispatcher: its version, its list of commands, and each subcommand's own help."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from dept_cli.main import COMMANDS, main


def exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    return int(exited.value.code or 0)


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["--version"]) == 0
    assert capsys.readouterr().out == f"dept {version('dept-flower')}\n"


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["--help"]) == 0
    out = capsys.readouterr().out
    for name, command in COMMANDS.items():
        assert f"  {name:<13}{command.summary}" in out


def test_no_command_shows_the_list_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "models" in capsys.readouterr().err


def test_an_unknown_command_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["train"]) == 2
    assert "invalid choice: 'train'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_subcommands_help_shows_an_example(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: dept {name} "), "the rest of the arguments went to it"
    assert f"examples:\n  dept {name}" in out
    assert "``" not in out and ":mod:" not in out, "plain text, no reST"


@pytest.mark.parametrize("name", ["compare", "cpt", "models"])
def test_a_subcommands_help_shows_the_defaults(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code([name, "--help"]) == 0
    assert "(default: " in capsys.readouterr().out
