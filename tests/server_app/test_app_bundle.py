"""dept run bundles the app from a staged copy of its fab-include files: the same bundle as
a clean checkout gives, without walking the checkout's virtual environment and outputs."""

from __future__ import annotations

import io
import subprocess
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk, build_fab_from_files

from server_app.app_bundle import staged_app

PROJECT = Path(__file__).resolve().parents[2]


def _contents(fab: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(fab)) as bundle:
        return {name: bundle.read(name) for name in bundle.namelist()}


def test_the_staged_app_bundles_as_a_clean_checkout_does(tmp_path: Path) -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=PROJECT, capture_output=True, text=True, check=True
    ).stdout.split()
    clean = {name: PROJECT / name for name in tracked if (PROJECT / name).is_file()}

    staged = staged_app(PROJECT, tmp_path / "app")

    assert staged == tmp_path / "app"
    assert len(list(staged.rglob("*"))) < 300, "the app's files, not the checkout"
    assert _contents(build_fab_from_disk(staged)) == _contents(build_fab_from_files(clean)[0])
    (staged / "stale.py").write_text("left by an earlier run")
    assert not (staged_app(PROJECT, staged) / "stale.py").exists(), "staged afresh each run"


def test_an_app_without_fab_include_is_bundled_from_its_own_folder(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.flwr.app]\npublisher = "me"\n')

    assert staged_app(tmp_path, tmp_path / "staged") == tmp_path
