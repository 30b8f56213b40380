"""What reaches the SuperLink through the gateway: only calls a registered SuperNode signed
just now, each body within its path's cap, and nothing while the verifier is down. Unsigned
bodies of hundreds of MB are refused from their headers; slow senders hold nothing an honest
node needs (issue #38)."""

from __future__ import annotations

import contextlib
import datetime
import re
import select
import socket
import ssl
import time
from pathlib import Path

import httpx
import psutil
import pytest
from flwr.supercore.constant import FLEET_HTTP_SIGNATURE_HEADER

from tests.deploy import gateway
from tests.deploy.doors import (
    NGINX_MISSING,
    Doors,
    allowed,
    fleet,
    from_the_gateway,
    node_key,
)

pytestmark = [pytest.mark.slow, NGINX_MISSING]


def peak_rss_mb(pid: int) -> float:
    """The peak resident memory (VmHWM) of ``pid`` and its children, in MB."""
    found = 0.0
    for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                found += int(line.split()[1]) / 1024
    return found


def post_unsigned(doors: Doors, path: str, size: int, chunked: bool) -> tuple[int, float, int]:
    """POST ``size`` zero bytes to the gateway with no signature, as fast as it takes them,
    until it answers: (status, seconds to the answer, bytes sent by then)."""
    host, port = doors.gateway.rsplit(":", 1)
    context = ssl.create_default_context(cafile=doors.certs / "ca.crt")
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {doors.gateway}\r\n"
        f"Content-Type: application/protobuf\r\n{framing}\r\n\r\n"
    )
    piece = bytes(2**20)
    frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        started = time.monotonic()
        tls.sendall(head.encode())
        sent = 0
        while not (select.select([tls], [], [], 0)[0] or tls.pending()):
            if sent >= size:
                select.select([tls], [], [], 10)
                break
            try:
                tls.sendall(frame)
            except OSError:  # the gateway answered and closed: the answer is still there
                break
            sent += len(piece)
        answer = tls.recv(4096).decode("latin-1")
        elapsed = time.monotonic() - started
    return int(answer.split()[1]), elapsed, sent


def test_an_unsigned_body_never_reaches_the_superlink(doors: Doors) -> None:
    """The issue's attack: 400 MB of zeros to push-messages, holding only ca.crt."""
    superlink = next(p for p in doors.loopback.processes if p.name == "superlink")
    before = peak_rss_mb(superlink.popen.pid)
    size = 400 * 2**20
    # Execute: streamed (no length: it passes the size cap's first look), then declared
    streamed = post_unsigned(doors, "/v1/fleet/push-messages", size, chunked=True)
    declared = post_unsigned(doors, "/v1/fleet/push-messages", size, chunked=False)
    # Assert: refused from the headers, within a second, and the SuperLink held nothing
    status, seconds, sent = streamed
    assert status == 401 and seconds < 1.0, streamed
    assert sent < size, "answered before the body was through"
    assert declared[0] == 413 and declared[1] < 1.0, declared
    grown = peak_rss_mb(superlink.popen.pid) - before
    assert grown < 50, f"the SuperLink's peak memory grew by {grown:.0f} MB"


def test_only_a_registered_keys_fresh_signature_passes(doors: Doors) -> None:
    signer, stranger = node_key(doors, "signer"), node_key(doors, "unknown")
    stale = datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(minutes=10)
    refusals = {
        "unsigned": ({}, 401),
        "unregistered key": (gateway.signed_headers(stranger), 401),
        "bad signature": (
            {**gateway.signed_headers(signer), FLEET_HTTP_SIGNATURE_HEADER: "AAAA"},
            401,
        ),
        "stale timestamp": (gateway.signed_headers(signer, at=stale), 401),
        "registered key, another key's signature": (
            gateway.signed_headers(signer, signer=stranger),
            401,
        ),
    }
    for case, (headers, status) in refusals.items():
        response = fleet(doors, "get-run", b"junk", headers)
        assert response.status_code == status and from_the_gateway(response), (case, response)
    # The signed call reaches the SuperLink, which finds no protobuf in the junk.
    passed = fleet(doors, "get-run", b"junk", gateway.signed_headers(signer))
    assert passed.status_code == 400 and "protobuf" in passed.text, passed.text


def test_bodies_are_capped_by_path(doors: Doors) -> None:
    signer = node_key(doors, "signer")
    # push-object carries one 5 MiB array chunk: 6 MiB gets through to the SuperLink
    chunk = fleet(doors, "push-object", bytes(6 * 2**20), gateway.signed_headers(signer))
    assert chunk.status_code == 400 and "protobuf" in chunk.text, chunk.text
    too_large = {"push-object": 9, "push-messages": 5, "get-run": 2}  # MiB
    for path, mib in too_large.items():
        response = fleet(doors, path, bytes(mib * 2**20), gateway.signed_headers(signer))
        assert response.status_code == 413 and from_the_gateway(response), (path, response)


def test_a_key_unregistered_mid_run_is_refused_within_seconds(doors: Doors) -> None:
    leaver, signed = node_key(doors, "leaver"), gateway.signed_headers
    registered = allowed(doors.operator_flwr("supernode", "register", doors.key("leaver")))
    node_id = re.search(r"SuperNode (\d+) registered", registered)
    assert node_id, registered
    assert not from_the_gateway(fleet(doors, "get-run", b"", signed(leaver)))
    # Execute
    allowed(doors.operator_flwr("supernode", "unregister", node_id.group(1)))
    unregistered = time.monotonic()
    # Assert
    while not from_the_gateway(
        response := fleet(doors, "get-run", b"", gateway.signed_headers(leaver))
    ):
        assert time.monotonic() - unregistered < 5, "still let through 5 s after"
        time.sleep(0.2)
    assert response.status_code == 401


def test_slow_senders_hold_nothing_an_honest_node_needs(doors: Doors) -> None:
    """The issue's second attack: many connections that each declare a 1 MB body and send
    one byte. Each is answered from its headers; a node elsewhere still gets through."""
    host, port = doors.gateway.rsplit(":", 1)
    context = ssl.create_default_context(cafile=doors.certs / "ca.crt")
    head = (
        f"POST /v1/fleet/push-messages HTTP/1.1\r\nHost: {doors.gateway}\r\n"
        "Content-Type: application/protobuf\r\nContent-Length: 1000000\r\n\r\n0"
    )
    with contextlib.ExitStack() as stack:
        answers = []
        for _ in range(100):
            raw = stack.enter_context(socket.create_connection((host, int(port)), timeout=5))
            tls = stack.enter_context(context.wrap_socket(raw, server_hostname=host))
            tls.sendall(head.encode())
            answers.append(int(tls.recv(4096).decode("latin-1").split()[1]))
        # An honest node on another address (limits are per address), while they hang on.
        transport = httpx.HTTPTransport(verify=context, local_address="127.0.0.2")
        signed = gateway.signed_headers(node_key(doors, "signer"))
        with httpx.Client(transport=transport, trust_env=False, timeout=10) as client:
            honest = client.post(
                f"https://{doors.gateway}/v1/fleet/get-run",
                content=b"junk",
                headers={"content-type": "application/protobuf", **signed},
            )
    assert set(answers) <= {401, 429} and answers.count(401) >= 32, answers
    assert honest.status_code == 400 and "protobuf" in honest.text, honest.text


def test_a_captured_signature_passes_once_and_a_node_holds_at_most_16_calls(
    doors: Doors,
) -> None:
    """Issue #49: Flower signs only a timestamp, so one captured header set acted as its node
    for ~305 s, with any body, and 241 slow bodies with valid signed headers were held."""
    signer = node_key(doors, "signer")
    captured = gateway.signed_headers(signer)
    first = fleet(doors, "get-run", b"junk", captured)
    assert first.status_code == 400 and "protobuf" in first.text, "it reached the SuperLink"
    replayed = fleet(doors, "get-run", b"junk", captured)
    assert replayed.status_code == 401 and from_the_gateway(replayed)
    # Slow bodies, each with a fresh signature of the one key: 16 are held, the rest refused.
    host, port = doors.gateway.rsplit(":", 1)
    context = ssl.create_default_context(cafile=doors.certs / "ca.crt")
    with contextlib.ExitStack() as stack:
        held, refused = 0, []
        for _ in range(20):
            signed = "".join(f"{k}: {v}\r\n" for k, v in gateway.signed_headers(signer).items())
            head = (
                f"POST /v1/fleet/push-messages HTTP/1.1\r\nHost: {doors.gateway}\r\n{signed}"
                "Content-Type: application/protobuf\r\nContent-Length: 1000000\r\n\r\n0"
            )
            raw = stack.enter_context(socket.create_connection((host, int(port)), timeout=5))
            tls = stack.enter_context(context.wrap_socket(raw, server_hostname=host))
            tls.sendall(head.encode())
            tls.settimeout(1.0)  # answered at once: not let through; else it is held
            try:
                refused.append(int(tls.recv(4096).decode("latin-1").split()[1]))
            except TimeoutError:
                held += 1
    assert held == 16 and refused == [429] * 4, (held, refused)


def test_the_gateway_fails_closed_without_its_verifier(doors: Doors) -> None:
    verifier = next(p for p in doors.loopback.processes if p.name == "gateway-auth")
    signer = node_key(doors, "signer")
    verifier.stop(grace_s=5)
    try:
        for path in ("get-run", "pull-messages", "push-object", "send-node-heartbeat"):
            response = fleet(
                doors, path, b"junk", gateway.signed_headers(node_key(doors, "signer"))
            )
            assert response.status_code == 500 and from_the_gateway(response), (path, response)
    finally:
        doors.loopback.processes.remove(verifier)
        doors.loopback.start_gateway_auth()
    assert not from_the_gateway(fleet(doors, "get-run", b"junk", gateway.signed_headers(signer)))
