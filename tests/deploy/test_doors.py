"""Door by door: what a stranger holding only ``ca.crt`` and the gateway's address can do to
the README's deployment (TLS, SuperNode authentication, the SuperExec secret, the SuperLink on
loopback behind the nginx gateway of ``docker/gateway.conf.template``), and that the operator,
on the SuperLink's loopback address, still can. One deployment for the whole module; the
federation test trains over nodes that connect through the gateway, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.proto.fleet_pb2 import RegisterNodeFleetRequest
from flwr.proto.runtime_pb2 import AcquireTaskRequest
from flwr.supercore.interceptors import (
    RuntimeVersionHttpInterceptor,
    SuperExecAuthHttpInterceptor,
)
from flwr.supercore.primitives.asymmetric import public_key_to_bytes
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.fleet_http_client import FleetHttpClient
from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

from tests.deploy.doors import (
    NGINX_MISSING,
    Doors,
    allowed,
    from_the_gateway,
    https,
    refused,
)
from tests.deploy.loopback import (
    PROJECT,
    RUN_S,
    SERVER_DONE,
    accepts,
    node_config,
    run_config,
    run_summary,
    wait_for,
    wait_for_line,
)

pytestmark = [pytest.mark.slow, NGINX_MISSING]
ACQUIRE_TASK = "/flwr.proto.Runtime/AcquireTask"


def acquire_task(address: str, ca: Path | None, secret: bytes | None) -> int:
    """POST /v1/runtime/acquire-task as a SuperExec does, signed with ``secret`` if given;
    returns the HTTP status. It asks for no task type, so it never claims a pending task."""
    interceptors = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret is not None:
        signer = SuperExecAuthHttpInterceptor(
            master_secret=secret, protected_methods=frozenset({ACQUIRE_TASK})
        )
        interceptors.append(signer)
    client = RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=ca is None,
        root_certificates=None if ca is None else ca.read_bytes(),
        interceptors=interceptors,
    )
    try:
        client.AcquireTask(AcquireTaskRequest())
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code
    finally:
        client.close()
    return 200


@pytest.mark.parametrize("command", [("ls",), ("supernode", "ls")], ids=" ".join)
def test_listing_is_for_the_operator_only(doors: Doors, command: tuple[str, ...]) -> None:
    refused(doors.outsider_flwr(*command))
    allowed(doors.operator_flwr(*command))


def test_registering_a_key_is_for_the_operator_only(doors: Doors) -> None:
    refused(doors.outsider_flwr("supernode", "register", doors.key("spare")))
    registered = allowed(doors.operator_flwr("supernode", "register", doors.key("spare")))
    assert "registered successfully" in registered


def test_a_node_cannot_register_itself_through_the_fleet_api(doors: Doors) -> None:
    """The Fleet API is public, so its own registration call must be off: a stranger's node
    with a fresh key of its own, signed as a SuperNode signs, through the gateway. The
    gateway refuses the unregistered key (401); the SuperLink would too (412, "registered
    via the CLI"), but only after reading the body."""
    key = ec.generate_private_key(ec.SECP384R1())
    interceptors = [
        RuntimeVersionHttpInterceptor(component_name="SuperNode"),
        NodeAuthHttpInterceptor(key, key.public_key()),
    ]
    ca = (doors.certs / "ca.crt").read_bytes()
    request = RegisterNodeFleetRequest(public_key=public_key_to_bytes(key.public_key()))
    client = FleetHttpClient.from_server_address(doors.gateway, False, ca, interceptors)
    with client, pytest.raises(httpx.HTTPStatusError) as refusal:
        client.RegisterNode(request)
    response = refusal.value.response
    assert response.status_code == 401 and from_the_gateway(response), response.text
    direct = FleetHttpClient.from_server_address(doors.loopback.address, False, ca, interceptors)
    with direct, pytest.raises(httpx.HTTPStatusError) as refusal:
        direct.RegisterNode(request)
    response = refusal.value.response
    assert response.status_code == 412 and "registered via the CLI" in response.text


def test_taking_the_serverapps_task_needs_the_superexec_secret(doors: Doors) -> None:
    superlink, ca = doors.loopback.address, doors.certs / "ca.crt"
    assert acquire_task(superlink, ca, None) == 401
    assert acquire_task(superlink, ca, b"a guess") == 401
    assert acquire_task(superlink, ca, doors.secret) == 200
    assert acquire_task(doors.gateway, ca, doors.secret) == 403, "the Runtime API is not public"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/control/list-runs",
        "/v1/runtime/acquire-task",
        "/health",
        "/docs",
        "/openapi.json",
        "/v1/fleet/%2e%2e/control/list-runs",
        "/v1/fleet/..%2Fcontrol%2Flist-runs",
        "/v1/fleet",
    ],
)
def test_the_gateway_refuses_all_but_the_fleet_api(doors: Doors, path: str) -> None:
    response = https(doors, "POST", doors.gateway, path)
    assert response.status_code == 403 and "only the SuperNode" in response.text, response.text


def test_a_federation_through_the_gateway(doors: Doors, tmp_path: Path) -> None:
    deployment, via = doors.loopback, doors.gateway
    state, out = tmp_path / "state", tmp_path / "out"
    config = run_config(out, **{"num-server-rounds": 2, "min-available-nodes": 2})
    # An unregistered key is refused at the gateway, and the node exits saying so.
    stranger, _ = deployment.start_supernode("greek", node_config("greek", state), "node-b", via)
    allowed(doors.operator_flwr("supernode", "register", doors.key("node-a")))
    first = deployment.add_node("latin", node_config("latin", state), key="node-a", via=via)

    refused(doors.outsider_flwr("run", str(PROJECT), "gateway", "--run-config", config))
    run = deployment.run(config)  # the server waits for two nodes
    run_id = wait_for_line(run, r"Successfully started run (\d+)", 60).group(1)
    refused(doors.outsider_flwr("stop", run_id))

    wait_for_line(stranger, r"Failed to activate SuperNode: the gateway refused it", 60)
    wait_for(lambda: stranger.popen.poll() is not None, 30, "the refused SuperNode to exit")
    # Once the operator registers its key, the same node joins.
    allowed(doors.operator_flwr("supernode", "register", doors.key("node-b")))
    deployment.add_node("greek", node_config("greek", state), key="node-b", via=via)
    # The node's own Runtime API, where its executor takes the ClientApp's tasks.
    wait_for(lambda: accepts(first.runtime_address), 30, "the SuperNode's Runtime API")
    assert acquire_task(first.runtime_address, None, None) == 401
    assert acquire_task(first.runtime_address, None, doors.secret) == 200
    wait_for_line(run, SERVER_DONE, RUN_S)

    summary = run_summary(deployment, out)
    assert set(summary["sources"]) == {"latin", "greek"}
    assert summary["avg_val_bpb"] < summary["initial_avg_val_bpb"]
    assert stranger.popen.returncode != 0


def test_stopping_a_run_is_for_the_operator_only(doors: Doors, tmp_path: Path) -> None:
    config = run_config(tmp_path / "out", **{"num-server-rounds": 1})
    started = allowed(doors.operator_flwr("run", str(PROJECT), "--run-config", config))
    run_id = started.split("Successfully started run ")[1].split()[0]
    refused(doors.outsider_flwr("stop", run_id))
    assert "successfully stopped" in allowed(doors.operator_flwr("stop", run_id))
    listed = json.loads(allowed(doors.operator_flwr("ls", "--run-id", run_id, "--format", "json")))
    assert listed["runs"][0]["status"] == "finished:stopped", listed


def test_from_the_network_only_the_gateway_answers(doors: Doors) -> None:
    if doors.public is None:
        pytest.skip("this machine has no non-loopback IPv4 address (hostname -I)")
    superlink_port = doors.loopback.port
    gateway_port = doors.gateway.rsplit(":", 1)[1]
    assert not accepts(f"{doors.public}:{superlink_port}"), "the SuperLink is on loopback only"
    assert accepts(f"{doors.public}:{gateway_port}")
    response = https(doors, "GET", f"{doors.public}:{gateway_port}", "/v1/control/list-runs")
    assert response.status_code == 403, response.text
    # The Fleet API answers, and asks for a registered node's signature.
    unsigned = https(doors, "POST", f"{doors.public}:{gateway_port}", "/v1/fleet/get-run")
    assert unsigned.status_code == 401 and from_the_gateway(unsigned), unsigned.text
