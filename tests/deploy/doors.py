"""The door tests' deployment, shared by ``test_doors.py`` (who may do what) and
``test_signed_calls.py`` (what reaches the SuperLink): the README's deployment (TLS, SuperNode
authentication, the SuperExec secret, the SuperLink on loopback behind the nginx gateway of
``docker/gateway.conf.template`` and its verifier), an outsider holding only ``ca.crt``, and
the calls each test makes. One deployment per test module (``conftest.py``'s ``doors``
fixture opens it with :func:`open_doors`)."""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dept.certificates import make_certificates
from tests.deploy import gateway
from tests.deploy.loopback import (
    Loopback,
    Tls,
    write_profile,
)

NGINX_MISSING = pytest.mark.skipif(
    gateway.nginx() is None,
    reason="nginx is not installed (apt-get install nginx-light): the gateway is nginx",
)


@dataclass
class Doors:
    loopback: Loopback  # the operator: its profile is the SuperLink's loopback address
    certs: Path
    gateway: str
    outsider: Path  # a $FLWR_HOME holding ca.crt and a profile to the gateway, nothing else
    public: str | None  # this machine's non-loopback address, in the certificate's names

    def outsider_flwr(self, *args: str) -> subprocess.CompletedProcess:
        return self.loopback.flwr(*args, home=self.outsider)

    def operator_flwr(self, *args: str) -> subprocess.CompletedProcess:
        return self.loopback.flwr(*args)

    def key(self, name: str) -> str:
        return str(self.certs / "supernodes" / f"{name}.pub")

    @property
    def secret(self) -> bytes:
        return (self.certs / "superexec.secret").read_bytes()


def public_address() -> str | None:
    """This machine's first non-loopback IPv4 address (``hostname -I``), if any."""
    try:
        words = subprocess.run(
            ["hostname", "-I"], capture_output=True, text=True, timeout=10
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    for word in words:
        try:
            address = ipaddress.ip_address(word)
        except ValueError:  # not an address: some hostname builds print a usage line instead
            continue
        if address.version == 4 and not (address.is_loopback or address.is_link_local):
            return word
    return None


def refused(done: subprocess.CompletedProcess) -> None:
    """The gateway's answer to anything but the Fleet API, as the flwr CLI reports it."""
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "403 Forbidden" in output, output


def allowed(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def https(doors: Doors, method: str, address: str, path: str, body: bytes = b"") -> httpx.Response:
    """One request checked against ``ca.crt`` (so against the certificate's names)."""
    context = ssl.create_default_context(cafile=doors.certs / "ca.crt")
    headers = {"content-type": "application/protobuf"}
    with httpx.Client(verify=context, trust_env=False, timeout=60) as client:
        return client.request(method, f"https://{address}{path}", content=body, headers=headers)


def from_the_gateway(response: httpx.Response) -> bool:
    """nginx's own answer (its page, or its refusal of a node), not the SuperLink's: the
    call went no further."""
    return "<html>" in response.text or "gateway" in response.text


def node_key(doors: Doors, name: str) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_ssh_private_key(
        (doors.certs / "supernodes" / name).read_bytes(), password=None
    )
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def fleet(
    doors: Doors, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> httpx.Response:
    """A Fleet call through the gateway, with ``headers`` (a node's signature) if given."""
    context = ssl.create_default_context(cafile=doors.certs / "ca.crt")
    sent = {"content-type": "application/protobuf", **(headers or {})}
    with httpx.Client(verify=context, trust_env=False, timeout=60) as client:
        return client.post(f"https://{doors.gateway}/v1/fleet/{path}", content=body, headers=sent)


@contextlib.contextmanager
def open_doors(root: Path) -> Iterator[Doors]:
    """The deployment under ``root``, taken down on leaving."""
    public = public_address()
    certs = root / "certs"
    names = ["127.0.0.1", gateway.SUPERLINK_TLS_NAME, *([public] if public else [])]
    make_certificates(certs, names, ["node-a", "node-b", "spare", "signer", "leaver", "unknown"])
    outsider = root / "outsider"
    outsider.mkdir()
    shutil.copy(certs / "ca.crt", outsider / "ca.crt")
    deployment = Loopback(root, tls=Tls(certs), auth=True, secret=True)
    try:
        deployment.start_superlink()
        address = deployment.start_gateway()
        registered = deployment.flwr(
            "supernode", "register", str(certs / "supernodes" / "signer.pub")
        )
        assert registered.returncode == 0, registered.stdout + registered.stderr
        write_profile(outsider, "gateway", address, Tls(outsider))
        yield Doors(deployment, certs, address, outsider, public)
    finally:
        deployment.close()
