"""dept-run checks what it can before Flower starts, and names the key: a held or unusable
output-dir, a bad sources file, a size the machine cannot serve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dept.config import ConfigError, config_keys, load_config, to_run_config
from server_app.launch import main as dept_run
from server_app.resume import check_resumable, resume_overrides
from tests.helpers import debug_run_config


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


def test_a_missing_data_file_names_its_source(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sources = tmp_path / "sources.yaml"
    sources.write_text("sources:\n  - name: novels\n    path: novels/*.txt\n")
    err = _refused(capsys, f"sources-file='{sources}'", f"output-dir='{tmp_path / 'out'}'")
    assert f"source 'novels': no file matches {tmp_path}/novels/*.txt" in err


def _checkpointed(out: Path, **settings: object) -> dict:
    """``out`` as an interrupted run leaves it: a round-1 checkpoint of this run config."""
    run_config = to_run_config(load_config(debug_run_config(out.parent, **settings)))
    state = out / "checkpoints" / "round-0001" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"round": 1, "run_config": run_config, "strategy": {}}))
    return run_config


def test_resume_takes_the_config_from_the_checkpoint(tmp_path: Path) -> None:
    saved = _checkpointed(tmp_path / "run", lr=0.004, **{"local-steps": 7})
    overrides = resume_overrides(tmp_path / "run", {"round-timeout-s": 60.0})
    assert overrides["lr"] == 0.004 and overrides["local-steps"] == 7
    assert overrides["round-timeout-s"] == 60.0 and overrides["resume"] is True
    assert overrides["output-dir"] == str(tmp_path / "run")
    assert {k: v for k, v in overrides.items() if k not in ("resume", "round-timeout-s")} == {
        k: v for k, v in saved.items() if k not in ("resume", "round-timeout-s")
    } | {"output-dir": str(tmp_path / "run")}


def test_resume_refuses_keys_that_change_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _checkpointed(tmp_path / "run")
    assert dept_run(["--resume", str(tmp_path / "run"), "-c", "lr=0.1 device='cpu'"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dept run: error: --resume takes the run config from the checkpoint;")
    assert "lr cannot change (only allow-device-change, device," in err and err.count("\n") == 1


def test_resume_without_a_checkpoint_fails_before_flower(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert dept_run(["--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"dept run: error: --resume: {tmp_path} holds no checkpoint of a run to resume\n"
    err = _refused(capsys, "resume=true", f"output-dir='{tmp_path}'")
    assert "config key 'resume' is true but" in err and "holds no checkpoint" in err


def test_resume_true_with_other_settings_names_them(tmp_path: Path) -> None:
    _checkpointed(tmp_path / "run", **{"local-steps": 7})
    moved = load_config(
        debug_run_config(tmp_path, **{"local-steps": 7, "output-dir": str(tmp_path / "moved")})
    )
    check_resumable(moved, tmp_path / "run")  # a moved folder is the same run
    changed = load_config(debug_run_config(tmp_path, **{"local-steps": 9}))
    with pytest.raises(ConfigError, match=r"'resume': local-steps differ .*\(local-steps=7\)"):
        check_resumable(changed, tmp_path / "run")


def test_a_new_run_into_a_folder_holding_one_is_refused_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a run stopped after round 1, and one finished (2 rounds, its summary written)
    stopped, finished = tmp_path / "stopped", tmp_path / "finished"
    _checkpointed(stopped)
    _checkpointed(finished, **{"num-server-rounds": 1})
    (finished / "summary.json").write_text("{}")
    # Execute, Assert: refused in one line, each saying what it holds and how to go on
    err = _refused(capsys, f"output-dir='{stopped}'")
    assert f"output-dir {stopped} holds a run checkpointed after round 1 (dept run --resume" in err
    assert err.rstrip().endswith("choose another output-dir, or start over in it with --force")
    err = _refused(capsys, f"output-dir='{finished}'", "num-server-rounds=1")
    assert f"output-dir {finished} holds a finished run; choose another" in err
    # --force goes past the check, to the next one (stopped here)
    monkeypatch.setattr("server_app.launch.check_fits_here", _stop_here)
    assert dept_run(["--force", "-c", f"output-dir='{stopped}'"]) == 1
    assert "reached the next check" in capsys.readouterr().err


def _stop_here(*args: object) -> None:
    raise RuntimeError("reached the next check")


def test_a_later_c_gives_a_key_its_value(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """As the help says: repeated -c are read in order, a later value wins."""
    first = f"output-dir='{tmp_path}' num-server-rounds=2"
    assert dept_run(["-c", first, "-c", "num-server-rounds=-3"]) == 2
    err = capsys.readouterr().err
    assert err == "dept run: error: config key 'num-server-rounds' must be >= 1\n", "-3 read"
