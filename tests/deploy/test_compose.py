"""The compose federation for real: ``docker/smoke.sh`` builds the images, runs the TLS
federation (node authentication, the gateway, an outsider refused; one node killed
mid-round and recreated on its state volume), and takes it all down. Slow (builds and a
federation). Runs wherever a container
engine answers, and skips saying why where none does, unless ``DEPT_CONTAINER_TEST=required``
(``.ci/run`` sets it), when a missing engine fails the test instead."""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers import with_venv_on_path

SMOKE = Path(__file__).resolve().parents[2] / "docker" / "smoke.sh"
BIN = Path(sys.executable).parent  # flwr, dept and podman-compose of this venv
# docker/python-base.sh's image: where it exists, the images are built on it (no registry).
PYTHON_BASE = "localhost/dept-python-base:bookworm"
SMOKE_S = 1800
# the packages superexec.Dockerfile copies into the image
PACKAGES = ("dept", "dept_strategy", "server_app", "client_app", "dept_cli")
IMAGES = {f"dept-flower/{role}:0.1.0" for role in ("superlink", "supernode", "superexec")}


def _answers(*command: str) -> bool:
    try:
        done = subprocess.run(command, capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def container_engine() -> tuple[str | None, str]:
    """The engine smoke.sh would use and its compose tool, or why there is none."""
    for engine, compose in (("podman", [str(BIN / "podman-compose")]), ("docker", ["docker"])):
        if shutil.which(engine) is None:
            continue
        if not _answers(engine, "info"):
            return None, f"{engine} is installed but '{engine} info' fails"
        if not _answers(*compose, *(["compose"] if engine == "docker" else []), "version"):
            return None, f"{engine} answers but its compose tool does not"
        return engine, ""
    return None, "no container engine (podman or docker) on PATH"


@pytest.fixture
def engine() -> str:
    found, reason = container_engine()
    if found is None:
        if os.environ.get("DEPT_CONTAINER_TEST") == "required":
            pytest.fail(f"DEPT_CONTAINER_TEST=required, but {reason}")
        pytest.skip(reason)
    return found


def smoke(engine: str, out: Path) -> subprocess.CompletedProcess:
    """smoke.sh to its end; on a timeout (or pytest's) it gets SIGTERM, so its trap still
    takes every container, network and volume down."""
    env = with_venv_on_path(ENGINE=engine, SMOKE_OUT=str(out))
    if _answers(engine, "image", "inspect", PYTHON_BASE):
        env["PYTHON_BASE"] = PYTHON_BASE
    process = subprocess.Popen(
        ["bash", str(SMOKE)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = process.communicate(timeout=SMOKE_S)
    finally:
        if process.poll() is None:
            process.terminate()
            process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, output)


@pytest.mark.slow
@pytest.mark.timeout(SMOKE_S + 360)
def test_the_compose_federation_builds_runs_and_recovers(engine: str, tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    done = smoke(engine, out)
    assert done.returncode == 0, done.stdout[-8000:]

    # What the script checked, read back from what it kept.
    built = {line.split("\t")[0] for line in (out / "builds.tsv").read_text().splitlines()}
    assert built >= IMAGES, built
    tls = json.loads((out / "tls" / "summary.json").read_text())
    assert len(tls["sources"]) == 3 and tls["avg_val_bpb"] < tls["initial_avg_val_bpb"]
    assert "embeddings from the state of round 1" in (out / "tls" / "reload.txt").read_text()
    assert "403" in (out / "tls" / "outsider.txt").read_text()


@pytest.mark.slow
def test_the_build_context_holds_every_module_of_the_packages(engine: str, tmp_path: Path) -> None:
    """What the engine's builder sends for the project's .dockerignore: every tracked module
    of the packages the images install (podman once left out every subfolder's). Seconds:
    a ``FROM scratch`` image of the context, listed through ``export``."""
    dockerfile = tmp_path / "context.Dockerfile"
    dockerfile.write_text("FROM scratch\nCOPY . /context\n")
    tag = f"localhost/dept-context-check:{os.getpid()}"
    root = Path(__file__).resolve().parents[2]
    run = functools.partial(subprocess.run, check=True, capture_output=True, timeout=300)
    run([engine, "build", "-q", "-f", str(dockerfile), "-t", tag, str(root)])
    try:
        container = run([engine, "create", tag, "none"], text=True).stdout.strip()
        try:
            listing = run([engine, "export", container]).stdout
        finally:
            run([engine, "rm", container])
    finally:
        run([engine, "rmi", "-f", tag])
    with tarfile.open(fileobj=io.BytesIO(listing)) as archive:
        sent = {n.removeprefix("context/") for n in archive.getnames()}
    tracked = subprocess.run(
        ["git", "ls-files", *PACKAGES], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    modules = {name for name in tracked if name.endswith(".py")}
    assert modules and modules <= sent, sorted(modules - sent)[:10]
    assert not any("__pycache__" in name for name in sent)
