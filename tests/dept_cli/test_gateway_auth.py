"""``dept gateway-auth`` on its own: each verdict from the headers a SuperNode signs, keys
read from a database made with the SuperLink's own schema, and the HTTP answer nginx gets.
Through real nginx and a real SuperLink: ``tests/deploy/test_doors.py``."""

from __future__ import annotations

import datetime
import http.client
import os
import shlex
import signal
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER
from flwr.supercore.primitives.asymmetric import public_key_to_bytes
from flwr.supercore.state.schema.linkstate_models import LinkStateBase
from sqlalchemy import create_engine

from dept_cli import gateway_auth
from dept_cli.gateway_auth import RegisteredKeys, SeenSignatures, check
from tests.command_examples import doc_examples
from tests.deploy.gateway import signed_headers
from tests.deploy.loopback import accepts, wait_for
from tests.helpers import with_venv_on_path

PROJECT = Path(__file__).resolve().parents[2]


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP384R1())


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "superlink.db"
    LinkStateBase.metadata.create_all(create_engine(f"sqlite:///{path}"))
    return path


def register(database: Path, key: ec.EllipticCurvePrivateKey, node_id: int, status: str) -> None:
    with sqlite3.connect(database) as db:
        db.execute(
            "INSERT INTO node (node_id, status, public_key) VALUES (?, ?, ?)",
            (node_id, status, public_key_to_bytes(key.public_key())),
        )


def set_status(database: Path, node_id: int, status: str) -> None:
    with sqlite3.connect(database) as db:
        db.execute("UPDATE node SET status = ? WHERE node_id = ?", (status, node_id))


def test_a_registered_nodes_fresh_signature_passes(database: Path) -> None:
    node = new_key()
    register(database, node, 1, "online")
    assert check(signed_headers(node), RegisteredKeys(database)).status == 200


@pytest.mark.parametrize(
    ("case", "status"),
    [
        ("no headers", 401),
        ("not base64", 401),
        ("no time zone", 401),
        ("stale", 401),
        ("from the future", 401),
        ("another key's signature", 401),
        ("not a key", 401),
        ("unregistered key", 401),
        ("never registered", 401),
    ],
)
def test_every_other_call_is_refused(database: Path, case: str, status: int) -> None:
    node, stranger = new_key(), new_key()
    register(database, node, 1, "online")
    register(database, stranger, 2, "unregistered")
    now = datetime.datetime.now(tz=datetime.UTC)
    headers = {
        "no headers": {},
        "not base64": {**signed_headers(node), FLEET_HTTP_SIGNATURE_HEADER: "%%%"},
        "no time zone": signed_headers(node, at=now.replace(tzinfo=None)),
        "stale": signed_headers(node, at=now - datetime.timedelta(minutes=10)),
        "from the future": signed_headers(node, at=now + datetime.timedelta(minutes=1)),
        "another key's signature": signed_headers(node, signer=stranger),
        "not a key": {**signed_headers(node), FLEET_HTTP_PUBLIC_KEY_HEADER: "bm90IGEga2V5"},
        "unregistered key": signed_headers(stranger),
        "never registered": signed_headers(new_key()),
    }[case]
    verdict = check(headers, RegisteredKeys(database))
    assert verdict.status == status, verdict


def test_a_change_in_registration_counts_once_the_verdict_expires(database: Path) -> None:
    node = new_key()
    register(database, node, 1, "registered")
    keys = RegisteredKeys(database, ttl_s=0.2)
    assert check(signed_headers(node), keys).status == 200
    # Execute: the operator unregisters it
    set_status(database, 1, "unregistered")
    # Assert: the cached verdict stands for ttl_s, then the database's
    assert check(signed_headers(node), keys).status == 200
    threading.Event().wait(0.3)
    assert check(signed_headers(node), keys).status == 401


def test_a_signature_passes_once_and_a_replay_is_refused(database: Path) -> None:
    node = new_key()
    register(database, node, 1, "online")
    keys, seen = RegisteredKeys(database), SeenSignatures()
    captured = signed_headers(node)
    assert check(captured, keys, seen=seen).status == 200
    replayed = check(captured, keys, seen=seen)
    assert (replayed.status, replayed.reason) == (401, "a signature already used (a replay)")
    assert check(signed_headers(node), keys, seen=seen).status == 200, "a fresh one passes"


def test_the_replay_cache_forgets_stale_signatures_and_fails_closed_when_full(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_auth, "MAX_SEEN", 2)
    seen = SeenSignatures(fresh_s=10.0)
    assert seen.first_use(b"a", signed_at=0.0, now=1.0) is None
    assert seen.first_use(b"b", signed_at=5.0, now=6.0) is None
    full = seen.first_use(b"c", signed_at=6.0, now=7.0)
    assert full is not None and full.status == 401, "both still fresh: refused, not forgotten"
    assert seen.first_use(b"c", signed_at=11.0, now=12.0) is None, "a's time is up: room"
    again = seen.first_use(b"b", signed_at=5.0, now=12.0)
    assert again is not None and "replay" in again.reason


def test_a_missing_table_fails_at_start(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        RegisteredKeys(empty)


@pytest.fixture
def verifier(database: Path) -> Iterator[tuple[str, int]]:
    server = gateway_auth.serve(database, "127.0.0.1:0")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[:2]  # type: ignore[misc]
    finally:
        server.shutdown()
        server.server_close()


def test_nginx_gets_the_verdict_as_the_status(database: Path, verifier: tuple[str, int]) -> None:
    node = new_key()
    register(database, node, 1, "online")
    answers = []
    connection = http.client.HTTPConnection(*verifier, timeout=10)
    captured = signed_headers(node)
    for headers in (captured, {}, signed_headers(new_key()), captured):
        connection.request("GET", "/check", headers=headers)  # one kept-alive connection
        response = connection.getresponse()
        assert response.read() == b""
        answers.append(response.status)
    connection.close()
    assert answers == [200, 401, 401, 401], "the last: the first one's headers, replayed"


def test_the_command_names_a_missing_database(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as stopped:
        gateway_auth.main(["--database", str(tmp_path / "nowhere.db")])
    assert stopped.value.code == 2


@pytest.mark.slow  # processes that import Flower
def test_the_examples_run_as_printed(tmp_path: Path) -> None:
    """The help's first and the docs' gateway recipe's line (its listen address the default,
    then named), run for real; the help's second as compose.tls.yml's service runs it."""
    examples = [
        line.split("#")[0].strip()
        for line in gateway_auth.EXAMPLES.splitlines()
        if line.strip().startswith("dept gateway-auth")
    ]
    beside, in_compose = examples
    (in_docs,) = [c for c in doc_examples() if c.startswith("dept gateway-auth")]
    compose = yaml.safe_load((PROJECT / "docker" / "compose.tls.yml").read_text())
    service = compose["services"]["gateway-auth"]
    assert [*service["entrypoint"], *service["command"]] == shlex.split(in_compose)
    (tmp_path / "dept-state").mkdir()
    LinkStateBase.metadata.create_all(
        create_engine(f"sqlite:///{tmp_path}/dept-state/superlink.db")
    )

    for script in (beside, f"{in_docs}\nwait"):  # the docs' line ends with &
        assert not accepts(gateway_auth.DEFAULT_LISTEN), "port 9301 is taken on this machine"
        verifier = subprocess.Popen(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=with_venv_on_path(HOME=str(tmp_path)),
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            wait_for(lambda: accepts(gateway_auth.DEFAULT_LISTEN), 60, script)
            connection = http.client.HTTPConnection(gateway_auth.DEFAULT_LISTEN, timeout=10)
            connection.request("GET", "/check")
            assert connection.getresponse().status == 401, "unsigned: refused"
            connection.close()
        finally:
            os.killpg(verifier.pid, signal.SIGTERM)
            _, err = verifier.communicate(timeout=30)
        assert f"keys from {tmp_path}/dept-state/superlink.db (read-only)" in err, err
