"""docker/ without a Docker engine: hadolint on every Dockerfile, every compose file against
the compose specification, and the wiring a deployment depends on (flwr version, one
executor, data volume and state volume per SuperNode)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
BIN = Path(sys.executable).parent
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
COMPOSE_FILES = sorted(DOCKER.glob("compose*.yml"))


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: install the test extra (pip install -e '.[test]')")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    done = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_file_follows_the_compose_spec(compose: Path) -> None:
    done = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(compose)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_images_pin_the_installed_flwr_version() -> None:
    installed = version("flwr")
    for dockerfile in DOCKERFILES:
        pinned = re.search(r"ARG FLWR_VERSION=(\S+)", dockerfile.read_text())
        assert pinned and pinned.group(1) == installed, dockerfile.name


def test_every_supernode_has_its_executor_data_and_state() -> None:
    services = yaml.safe_load((DOCKER / "compose.yml").read_text())["services"]
    nodes = sorted(s for s in services if s.startswith("supernode-"))
    assert len(nodes) >= 3
    states = set()
    for node in nodes:
        index = node.removeprefix("supernode-")
        config = services[node]["environment"]["NODE_CONFIG"]
        for key in ("source=", "path=", "vocab-size=", "state-dir='/app/state'"):
            assert key in config, (node, key)
        executor = services[f"superexec-clientapp-{index}"]
        assert executor["command"][-1] == f"{node}:9094"
        mounts = dict(_target_and_source(v) for v in executor["volumes"])
        assert "/data" in mounts and "/app/state" in mounts, executor["volumes"]
        states.add(mounts["/app/state"])
    assert len(states) == len(nodes), "each node needs its own state volume"


def _target_and_source(volume: str) -> tuple[str, str]:
    """``source:target[:mode]`` where the source may hold ``${VAR:-default}``."""
    spec = volume.removesuffix(":ro").removesuffix(":rw")
    source, target = spec.rsplit(":", 1)
    return target, source


def test_tls_overlay_secures_every_supernode() -> None:
    overlay = yaml.safe_load((DOCKER / "compose.tls.yml").read_text())["services"]
    assert "--enable-supernode-auth" in overlay["superlink"]["command"]
    base = yaml.safe_load((DOCKER / "compose.yml").read_text())["services"]
    for node in (s for s in base if s.startswith("supernode-")):
        security = overlay[node]["environment"]["SUPERLINK_SECURITY"]
        assert "--root-certificates" in security and "--auth-supernode-private-key" in security
