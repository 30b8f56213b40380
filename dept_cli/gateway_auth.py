"""``dept gateway-auth``: the gateway's doorman, which lets a Fleet API call through only if
its headers carry a registered SuperNode's fresh signature, before a byte of its body moves.

The SuperLink checks the same signature, but only after it has read and parsed the whole
body: an unsigned 400 MB POST took it from 150 MB to 930 MB of memory. nginx asks this
service first (``auth_request``, with the headers alone), so a stranger's body never
reaches the SuperLink. The check is the SuperLink's own (Flower's headers, tolerance and
signature primitives): the node's public key, an ISO timestamp and its ECDSA signature of
that timestamp. One thing it adds: a signature passes once (:class:`SeenSignatures`), so a
captured header set cannot act as its node while its timestamp is fresh.

Registered keys are read from the SuperLink's own database, read-only: it is what
``flwr supernode register`` and ``unregister`` write, so a change is seen once a key's
cached verdict expires (:data:`VERDICT_S`), with no second list for the operator to keep in
step. Answers: 200 pass, 401 refused (no, malformed, stale or wrong signature, or a key
that is not registered: the SuperLink's own answer there, on which a SuperNode stops rather
than retries), the reason in this service's log. nginx treats anything else, and no answer
within its timeout, as a refusal, so a verifier that is down or slow fails closed.
"""

from __future__ import annotations

import argparse
import binascii
import contextlib
import datetime
import logging
import sqlite3
import threading
import time
from base64 import b64decode
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import UnsupportedAlgorithm
from flwr.common.constant import SYSTEM_TIME_TOLERANCE, TIMESTAMP_HEADER, TIMESTAMP_TOLERANCE
from flwr.supercore.constant import (
    FLEET_HTTP_PUBLIC_KEY_HEADER,
    FLEET_HTTP_SIGNATURE_HEADER,
    NodeStatus,
)
from flwr.supercore.primitives.asymmetric import bytes_to_public_key, verify_signature

from dept.cli_help import HelpFormatter
from dept.logs import log_to_terminal

log = logging.getLogger(__name__)

VERDICT_S = 2.0  # how long a key's registration verdict is reused before the database is asked
MAX_CACHED_KEYS = 4096  # then the cache starts afresh: signed junk keys cannot grow it forever
# A signature is fresh for as long as the SuperLink accepts its timestamp; it passes once.
FRESH_S = TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE
MAX_SEEN = 200_000  # fresh signatures kept at once (a node's calls in FRESH_S, all nodes)
LOG_EVERY_S = 10.0  # a refusal reason is logged at most this often (a flood stays one line)
DEFAULT_LISTEN = "127.0.0.1:9301"
EXAMPLES = """examples:
  dept gateway-auth --database ~/dept-state/superlink.db     # listens on 127.0.0.1:9301
  dept gateway-auth --database=/app/state/superlink.db --listen=0.0.0.0:9301   # compose.tls.yml
the gateway's template asks it at GATEWAY_AUTH (docker/gateway.conf.template).
"""


class Headers(Protocol):
    """A request's headers: a dict, or the ``email.message.Message`` http.server gives."""

    def get(self, name: str, /) -> str | None: ...


@dataclass(frozen=True)
class Verdict:
    status: int  # 200 or 401: what nginx passes on
    reason: str


PASS = Verdict(200, "a registered key's fresh signature")


class RegisteredKeys:
    """Which public keys the SuperLink's database holds as registered (any status but
    unregistered), each answer reused for ``ttl_s``."""

    def __init__(self, database: Path, ttl_s: float = VERDICT_S) -> None:
        self.database, self.ttl_s = database, ttl_s
        self._verdicts: dict[bytes, tuple[bool, float]] = {}
        self._lock = threading.Lock()
        self.registered(b"")  # a missing or foreign database fails here, at start

    def registered(self, key: bytes) -> bool:
        now = time.monotonic()
        with self._lock:
            cached = self._verdicts.get(key)
        if cached is not None and now - cached[1] < self.ttl_s:
            return cached[0]
        verdict = self._ask(key)
        with self._lock:
            if len(self._verdicts) >= MAX_CACHED_KEYS:
                self._verdicts.clear()
            self._verdicts[key] = (verdict, now)
        return verdict

    def _ask(self, key: bytes) -> bool:
        uri = f"{self.database.resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=1.0)) as db:
            row = db.execute("SELECT status FROM node WHERE public_key = ?", (key,)).fetchone()
        return row is not None and row[0] != NodeStatus.UNREGISTERED


class SeenSignatures:
    """The signatures that passed while they are fresh, so each passes once: Flower signs
    only a timestamp, and one captured header set would otherwise act as its node, with any
    body, from anywhere, until it goes stale. A SuperNode signs every attempt of every call
    anew (its HTTP client builds a fresh request per retry), so an honest node never sends
    one twice. Bounded: past :data:`MAX_SEEN` fresh signatures at once it refuses (fails
    closed) rather than forgets one that could then be replayed."""

    def __init__(self, fresh_s: float = FRESH_S) -> None:
        self.fresh_s = fresh_s
        self._expiry: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def first_use(self, signature: bytes, signed_at: float, now: float) -> Verdict | None:
        """None, and the signature is kept, where this is its first use; else the refusal."""
        with self._lock:
            if signature in self._expiry:
                return Verdict(401, "a signature already used (a replay)")
            if len(self._expiry) >= MAX_SEEN:
                self._expiry = {s: t for s, t in self._expiry.items() if t > now}
                if len(self._expiry) >= MAX_SEEN:
                    return Verdict(401, f"more than {MAX_SEEN} fresh signatures at once")
            self._expiry[signature] = signed_at + self.fresh_s
        return None


def check(
    headers: Headers,
    keys: RegisteredKeys,
    clock: Callable[[], float] = time.time,
    seen: SeenSignatures | None = None,
) -> Verdict:
    """The verdict on one Fleet call's headers, as the SuperLink would judge them, and, with
    ``seen``, refused where the same signature passed before."""
    names = (FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER, TIMESTAMP_HEADER)
    encoded_key, encoded_signature, stamp = (headers.get(name) for name in names)
    if encoded_key is None or encoded_signature is None or stamp is None:
        return Verdict(401, "no SuperNode signature headers")
    try:
        key = b64decode(encoded_key, validate=True)
        signature = b64decode(encoded_signature, validate=True)
        signed_at = datetime.datetime.fromisoformat(stamp)
    except (ValueError, binascii.Error):
        return Verdict(401, "malformed SuperNode signature headers")
    if signed_at.tzinfo is None:
        return Verdict(401, "a timestamp without a time zone")
    age = clock() - signed_at.timestamp()
    if not -SYSTEM_TIME_TOLERANCE < age < TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE:
        return Verdict(401, f"a timestamp {age:.0f} s old")
    try:
        signed = verify_signature(bytes_to_public_key(key), stamp.encode("ascii"), signature)
    except (ValueError, TypeError, UnicodeError, UnsupportedAlgorithm):
        return Verdict(401, "not a public key")
    if not signed:
        return Verdict(401, "a signature that does not match the key")
    if not keys.registered(key):
        return Verdict(401, "a key that is not registered")
    if seen is not None and (replayed := seen.first_use(signature, signed_at.timestamp(), clock())):
        return replayed
    return PASS


@dataclass
class RefusalLog:
    """Refusals counted by reason, each reason logged at most every :data:`LOG_EVERY_S`."""

    counts: dict[str, int] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refused(self, verdict: Verdict, client: str) -> None:
        now = time.monotonic()
        with self.lock:
            self.counts[verdict.reason] = self.counts.get(verdict.reason, 0) + 1
            if now - self.last.get(verdict.reason, -LOG_EVERY_S) < LOG_EVERY_S:
                return
            self.last[verdict.reason] = now
            count = self.counts.pop(verdict.reason)
        log.warning(
            "refused %d Fleet call(s) with %s (latest from %s)", count, verdict.reason, client
        )


def handler(
    keys: RegisteredKeys, refusals: RefusalLog, seen: SeenSignatures
) -> type[BaseHTTPRequestHandler]:
    """The request handler: any method, any path, the verdict as the status, no body."""

    class Verdicts(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: nginx may reuse its connections

        def _answer(self) -> None:
            verdict = check(self.headers, keys, seen=seen)
            if verdict.status != 200:
                client = self.headers.get("X-Forwarded-For", self.client_address[0])
                refusals.refused(verdict, client)
            self.send_response(verdict.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_HEAD = _answer

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: refusals are logged by reason, passes not at all."""

    return Verdicts


def serve(database: Path, listen: str, ttl_s: float = VERDICT_S) -> ThreadingHTTPServer:
    """The verifier bound to ``listen`` (HOST:PORT; port 0 takes a free one), not yet serving."""
    host, _, port = listen.rpartition(":")
    keys = RegisteredKeys(database, ttl_s)
    server = ThreadingHTTPServer((host, int(port)), handler(keys, RefusalLog(), SeenSignatures()))
    server.daemon_threads = True
    return server


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(
        prog="dept gateway-auth",
        description=__doc__.split("\n\n")[0].replace("``", "'"),
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    out.add_argument(
        "--database",
        type=Path,
        required=True,
        help="the SuperLink's database (its --database), opened read-only",
    )
    out.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help=f"HOST:PORT to answer nginx's auth_request on (default {DEFAULT_LISTEN})",
    )
    out.add_argument(
        "--verdict-s",
        type=float,
        default=VERDICT_S,
        help="how long a key's registration is trusted before the database is asked again",
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    log_to_terminal("%(asctime)s %(levelname)s %(message)s")
    if not args.database.is_file():
        parser().error(f"--database {args.database}: no such file (the SuperLink's --database)")
    try:
        server = serve(args.database, args.listen, args.verdict_s)
    except sqlite3.Error as exc:
        parser().error(f"--database {args.database}: not a SuperLink database ({exc})")
    host, port = server.server_address[:2]
    log.info("gateway-auth on %s:%s, keys from %s (read-only)", host, port, args.database)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0
