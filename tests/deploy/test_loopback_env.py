"""The loopback deployment's processes find this venv's Flower apps, activated or not."""

import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.deploy.loopback import Loopback


def test_the_executors_find_this_venvs_apps_without_an_activated_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # as from `.venv/bin/python -m benchmarks...`
    previous = signal.getsignal(signal.SIGTERM)
    try:
        deployment = Loopback(tmp_path)
    finally:
        signal.signal(signal.SIGTERM, previous)
    for app in ("flwr-serverapp", "flwr-clientapp"):  # what the SuperExecs start by name
        assert shutil.which(app, path=deployment.env["PATH"]), app
    assert deployment.env["PATH"].split(os.pathsep)[-2:] == ["/usr/bin", "/bin"]
