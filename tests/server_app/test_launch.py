"""dept-run checks what it can before Flower starts, and names the key: a held or unusable
output-dir, a bad sources file, a size the machine cannot serve."""

from __future__ import annotations

from pathlib import Path

import pytest

from dept.config import config_keys
from server_app.launch import main as dept_run


def _refused(capsys: pytest.CaptureFixture, *overrides: str) -> str:
    assert dept_run(["-c", " ".join(overrides)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dept run: error: ") and err.count("\n") == 1, err
    return err


def test_an_output_dir_another_run_holds(
    held_output: tuple[Path, int], capsys: pytest.CaptureFixture
) -> None:
    out, pid = held_output
    err = _refused(capsys, f"output-dir='{out}'")
    assert f"config key 'output-dir': {out} is in use by pid {pid}" in err


def test_an_output_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    afile = tmp_path / "results"
    afile.write_text("not a folder")
    err = _refused(capsys, f"output-dir='{afile}'")
    assert f"config key 'output-dir': cannot use {afile} as a folder" in err


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"sources: [unclosed", "is not valid YAML: "),
        (b"\xff\xfe sources", "is not UTF-8 text (invalid byte 0xff at offset 0)"),
    ],
)
def test_a_bad_sources_file(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: bytes, why: str
) -> None:
    sources = tmp_path / "sources.yaml"
    sources.write_bytes(content)
    err = _refused(capsys, f"sources-file='{sources}'", f"output-dir='{tmp_path / 'out'}'")
    assert f"config key 'sources-file': sources file {sources} {why}" in err


def test_a_round_no_machine_here_can_finish(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = _refused(capsys, "grad-accum-steps=100000", f"output-dir='{tmp_path / 'out'}'")
    assert err.startswith("dept run: error: config key 'grad-accum-steps' (100,000)"), err


def test_a_sequence_whose_logits_cannot_fit(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = _refused(capsys, "seq-len=4000000", f"output-dir='{tmp_path / 'out'}'")
    assert "config key 'seq-len' (4,000,000): a client needs at least" in err


def test_help_is_plain_text_and_lists_every_run_config_key(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        dept_run(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert "``" not in out and ":data:" not in out and "examples:" in out
    assert "(default: one per source)" in out
    unwrapped = " ".join(out.split())
    for k in config_keys():
        assert f"  {k.key} = {k.shown_default}  [{k.kind}]\n" in out
        assert k.doc in unwrapped
