"""docker/ without a container engine: hadolint on every Dockerfile, shellcheck on every
script, every compose file against the compose specification, the gateway's nginx template
through both ways of filling it in and ``nginx -t``, and the wiring a deployment depends on
(flwr version, what the build context lets in, one executor, data volume and state volume per
SuperNode; only the gateway on a public interface; the SuperExec secret and the gateway for
every node in the TLS overlay, the SuperLink off the nodes' network; a GPU of its own per
executor). ``test_compose.py`` builds and runs it all for real."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from dept.certificates import make_certificates
from tests.deploy import gateway

PROJECT = Path(__file__).resolve().parents[2]
DOCKER = PROJECT / "docker"
BIN = Path(sys.executable).parent
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
ROLES = ("superlink", "supernode", "superexec")  # built on Flower's image of that name
SCRIPTS = [*sorted(DOCKER.glob("*.sh")), PROJECT / ".ci" / "run"]
COMPOSE_FILES = sorted(DOCKER.glob("compose*.yml"))
SECRET = "/app/certs/superexec.secret"
PLACEHOLDER = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")


def tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: install the test extra (pip install -e '.[test]')")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    done = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_passes_shellcheck(script: Path) -> None:
    done = subprocess.run([tool("shellcheck"), str(script)], capture_output=True, text=True)
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
    for role in ROLES:
        text = (DOCKER / f"{role}.Dockerfile").read_text()
        assert f"ARG BASE_IMAGE=flwr/{role}:{installed}\n" in text, role
        assert "FROM ${BASE_IMAGE}\n" in text, role
    stand_in = re.search(r"ARG FLWR_VERSION=(\S+)", (DOCKER / "flwr-base.Dockerfile").read_text())
    assert stand_in and stand_in.group(1) == installed


def test_the_build_context_lets_in_what_the_dockerfiles_copy() -> None:
    """.dockerignore shuts out all but what it names (not the venv, data or caches): every
    COPY and bind-mount source must be named there, or the build fails at that step."""
    admitted = [
        line[1:]
        for line in (PROJECT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    copy = re.compile(r"^COPY (?:--\S+ )*(.+) \S+$", re.MULTILINE)
    mount = re.compile(r"--mount=type=bind,source=([^,\s]+)")
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        sources = [s for m in copy.finditer(text) for s in m.group(1).split()]
        sources += mount.findall(text)
        for source in sources:
            assert any(p == source or p.startswith(f"{source}/") for p in admitted), (
                dockerfile.name,
                source,
            )


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


def _services(name: str) -> dict:
    return yaml.safe_load((DOCKER / name).read_text())["services"]


def _public_ports(service: dict) -> list[object]:
    """Published ports not bound to the host's loopback: short syntax
    ``[HOST_IP:]HOST_PORT:CONTAINER_PORT`` or long syntax with ``host_ip``."""
    return [
        port
        for port in service.get("ports", [])
        if not (
            port.get("host_ip") == "127.0.0.1"
            if isinstance(port, dict)
            else str(port).startswith("127.0.0.1:")
        )
    ]


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_only_the_gateway_is_published_on_public_interfaces(compose: Path) -> None:
    for name, service in _services(compose.name).items():
        if name != "gateway":
            assert not _public_ports(service), (compose.name, name, service["ports"])


def test_the_gateway_is_pinned_and_fills_every_placeholder() -> None:
    service = _services("compose.tls.yml")["gateway"]
    pinned = r"\$\{GATEWAY_IMAGE:-nginx:\d+\.\d+\.\d+(-alpine)?\}"
    assert re.fullmatch(pinned, service["image"]), service["image"]
    assert _public_ports(service), "the gateway is the public door"
    placeholders = set(PLACEHOLDER.findall(gateway.TEMPLATE.read_text()))
    assert placeholders == set(service["environment"]), placeholders
    mounts = dict(_target_and_source(v) for v in service["volumes"])
    assert mounts["/etc/nginx/templates/default.conf.template"] == "./gateway.conf.template"


def _holds_the_secret(service: dict) -> bool:
    """The secret flag on its command line (or in the env its command expands) and the file."""
    flags = " ".join([*service.get("command", []), *service.get("environment", {}).values()])
    mounted = SECRET in {_target_and_source(v)[0] for v in service.get("volumes", [])}
    return mounted and re.search(rf"--superexec-auth-secret-file[= ]{SECRET}", flags) is not None


def test_tls_overlay_secures_every_supernode() -> None:
    overlay = _services("compose.tls.yml")
    assert "--enable-supernode-auth" in overlay["superlink"]["command"]
    nodes = [s for s in _services("compose.yml") if s.startswith("supernode-")]
    executors = [s for s in overlay if s.startswith("superexec-")]
    assert len(executors) == len(nodes) + 1
    for name in ["superlink", *nodes, *executors]:
        assert _holds_the_secret(overlay[name]), name
    for node in nodes:
        environment = overlay[node]["environment"]
        security = environment["SUPERLINK_SECURITY"]
        assert "--root-certificates" in security and "--auth-supernode-private-key" in security
        assert environment["SUPERLINK_ADDRESS"] == "${SUPERLINK_ADDRESS:-gateway:8443}", node


def test_tls_overlay_keeps_the_superlink_off_the_nodes_network() -> None:
    """On the nodes' network (default) only the gateway leads to the SuperLink: whatever else
    runs there cannot reach its Control API."""
    overlay = _services("compose.tls.yml")
    assert overlay["superlink"]["networks"] == ["control"]
    assert overlay["superexec-serverapp"]["networks"] == ["control"]
    assert set(overlay["gateway"]["networks"]) == {"control", "default"}
    for name, service in overlay.items():
        if name.startswith(("supernode-", "superexec-clientapp-")):
            assert "networks" not in service, name


def test_gpu_overlay_gives_every_executor_a_gpu_of_its_own() -> None:
    """device_ids, not count: count=1 on every executor put them all on GPU 0."""
    executors = [s for s in _services("compose.yml") if s.startswith("superexec-clientapp-")]
    overlay = _services("compose.gpu.yml")
    assert set(overlay) == set(executors)
    defaults = []
    for name in executors:
        (device,) = overlay[name]["deploy"]["resources"]["reservations"]["devices"]
        assert "count" not in device and device["capabilities"] == ["gpu"], name
        (ids,) = device["device_ids"]
        index = name.removeprefix("superexec-clientapp-")
        default = re.fullmatch(rf"\$\{{NODE{index}_GPU:-(\d+)\}}", ids)
        assert default, (name, ids)
        defaults.append(default.group(1))
    assert len(set(defaults)) == len(executors), defaults


def test_the_template_renders_the_same_through_envsubst(tmp_path: Path) -> None:
    """The official image's way: envsubst limited to the names defined in the environment."""
    envsubst = shutil.which("envsubst")
    if envsubst is None:
        pytest.skip("envsubst is missing (apt-get install gettext-base)")
    values = {
        "GATEWAY_LISTEN": "127.0.0.1:1",
        "GATEWAY_AUTH": "127.0.0.1:3",
        "GATEWAY_CERT": str(tmp_path / "server.pem"),
        "GATEWAY_KEY": str(tmp_path / "server.key"),
        "SUPERLINK_UPSTREAM": "127.0.0.1:2",
        "SUPERLINK_CA": str(tmp_path / "ca.crt"),
        "SUPERLINK_TLS_NAME": gateway.SUPERLINK_TLS_NAME,
    }
    environment = {**os.environ, **values}
    names = " ".join(f"${{{name}}}" for name in environment)
    done = subprocess.run(
        [envsubst, names],
        input=gateway.TEMPLATE.read_text(),
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "${" not in done.stdout and "$remote_addr" in done.stdout, done.stdout
    assert done.stdout == gateway.render("127.0.0.1:1", "127.0.0.1:2", tmp_path, "127.0.0.1:3")


def test_the_docs_gateway_recipe_renders_the_template_whole(tmp_path: Path) -> None:
    """docs/deployment.md's export and envsubst lines as printed (the output file moved out
    of /etc): every name the template uses is in its list, so nothing is left unfilled."""
    if shutil.which("envsubst") is None:
        pytest.skip("envsubst is missing (apt-get install gettext-base)")
    doc = (PROJECT / "docs" / "deployment.md").read_text()
    recipe = next(
        b for b in re.findall(r"^```bash\n(.*?)^```$", doc, re.S | re.M) if "envsubst" in b
    )
    lines = recipe[recipe.index("export GATEWAY_LISTEN") : recipe.index("\nnginx -t")]
    output = tmp_path / "dept-gateway.conf"
    script = lines.replace("/etc/nginx/conf.d/dept-gateway.conf", str(output))

    subprocess.run(["bash", "-c", script], cwd=PROJECT, check=True, env=dict(os.environ))

    certs = Path("/home/me/dept-certs")
    assert output.read_text() == gateway.render("8443", "127.0.0.1:8000", certs, "127.0.0.1:9301")


def test_the_rendered_gateway_passes_nginx_t(tmp_path: Path) -> None:
    nginx = gateway.nginx()
    if nginx is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    make_certificates(tmp_path / "certs", ["localhost"], [])
    folder, certs = tmp_path / "gw", tmp_path / "certs"
    config = gateway.write_config(folder, "127.0.0.1:1", "127.0.0.1:2", certs, "127.0.0.1:3")
    done = subprocess.run(
        [nginx, "-t", *gateway.arguments(tmp_path / "gw", config)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
