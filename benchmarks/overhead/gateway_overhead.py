"""What the gateway's signature check costs a node: latency per Fleet call and the throughput
of a 350m-size reply, through the gateway against straight to the SuperLink.

A real loopback deployment (``tests/deploy/loopback.py``: a TLS SuperLink with SuperNode
authentication, ``dept gateway-auth`` and nginx with ``docker/gateway.conf.template``) and a
registered key that signs every call as a SuperNode does. Arms, interleaved call by call:

- ``direct``: the SuperLink itself (its own signature check, after reading the body);
- ``gateway``: through nginx, which asks the verifier first, then forwards;
- ``verifier``: the verifier alone (what nginx's subrequest adds, on loopback HTTP).

Latency: ``get-run`` with a 16-byte body. Throughput: a SPEC reply of the ``llama:350m``
body in float32, sent as Flower sends arrays, one ``push-object`` call per 5 MiB chunk.
The bodies are not valid protobuf, so the SuperLink reads and parses each and answers 400:
what is measured is the way there and back, not the SuperLink storing objects.

    python -m benchmarks.overhead.gateway_overhead          # 300 calls, a 350m reply, per arm
    python -m benchmarks.overhead.gateway_overhead --quick  # 30 calls, 100 MB
"""

from __future__ import annotations

import argparse
import functools
import http.client
import ssl
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE

from benchmarks.measure import (
    common_arguments,
    parse_quick,
    print_table,
    result_header,
    write_outputs,
)
from dept.certificates import make_certificates
from dept.model.build import build_model
from dept.model.roles import body_parameters, count_params
from tests.deploy import gateway
from tests.deploy.loopback import Loopback, Tls

NAME = "gateway-overhead"
MODEL = "llama:350m"
CALL_BODY = bytes(16)


def reply_bytes(model: str) -> int:
    """A SPEC reply's bytes: the body's parameters in float32 (built on the meta device)."""
    with torch.device("meta"):
        built = build_model(model, 4096, 2048, tie_embeddings=True)
    return 4 * count_params(body_parameters(built))


def node_key(certs: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_ssh_private_key(
        (certs / "supernodes" / "bench").read_bytes(), password=None
    )
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def fleet_client(ca: Path) -> httpx.Client:
    context = ssl.create_default_context(cafile=ca)
    return httpx.Client(verify=context, trust_env=False, timeout=120)


def timed_call(
    client: httpx.Client, url: str, key: ec.EllipticCurvePrivateKey, body: bytes
) -> float:
    """Seconds for one signed call; it must have reached the SuperLink (its 400)."""
    headers = {"content-type": "application/protobuf", **gateway.signed_headers(key)}
    started = time.perf_counter()
    response = client.post(url, content=body, headers=headers)
    elapsed = time.perf_counter() - started
    assert response.status_code == 400 and "protobuf" in response.text, response.text
    return elapsed


def verifier_call(address: str, key: ec.EllipticCurvePrivateKey) -> Callable[[], float]:
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)

    def call() -> float:
        started = time.perf_counter()
        connection.request("GET", "/check", headers=gateway.signed_headers(key))
        response = connection.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        assert response.status == 200, response.status
        return elapsed

    return call


def run(args: argparse.Namespace, root: Path) -> dict:
    certs = root / "certs"
    make_certificates(certs, ["127.0.0.1", gateway.SUPERLINK_TLS_NAME], ["bench"])
    deployment = Loopback(root, tls=Tls(certs), auth=True, secret=True)
    try:
        deployment.start_superlink()
        via = deployment.start_gateway()
        registered = deployment.flwr("supernode", "register", str(certs / "supernodes/bench.pub"))
        assert registered.returncode == 0, registered.stdout + registered.stderr
        key = node_key(certs)
        bases = {"direct": deployment.address, "gateway": via}
        clients = {arm: fleet_client(certs / "ca.crt") for arm in bases}
        calls: dict[str, Callable[[], float]] = {
            arm: functools.partial(
                timed_call, clients[arm], f"https://{bases[arm]}/v1/fleet/get-run", key, CALL_BODY
            )
            for arm in bases
        }
        calls["verifier"] = verifier_call(deployment.gateway_auth, key)
        for call in calls.values():  # connections open, TLS sessions made
            call()
        latencies: dict[str, list[float]] = {arm: [] for arm in calls}
        for i in range(args.calls):
            order = list(calls)[i % len(calls) :] + list(calls)[: i % len(calls)]
            for arm in order:
                latencies[arm].append(calls[arm]())

        size = args.reply_mb * 2**20 if args.reply_mb else reply_bytes(MODEL)
        chunk = bytes(FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE)
        chunks = -(-size // len(chunk))
        transfers: dict[str, list[float]] = {arm: [] for arm in bases}
        for repeat in range(args.repeats):
            for arm in list(bases)[repeat % 2 :] + list(bases)[: repeat % 2]:
                url = f"https://{bases[arm]}/v1/fleet/push-object"
                started = time.perf_counter()
                for _ in range(chunks):
                    timed_call(clients[arm], url, key, chunk)
                transfers[arm].append(time.perf_counter() - started)
        for client in clients.values():
            client.close()
    finally:
        deployment.close()
    return {
        "latency_ms": {a: [1000 * v for v in values] for a, values in latencies.items()},
        "reply": {
            "model": None if args.reply_mb else MODEL,
            "bytes": chunks * len(chunk),
            "chunks": chunks,
            "seconds": transfers,
        },
    }


def summarise(measured: dict) -> tuple[list[list], list[dict]]:
    rows, flat = [], []
    latency = measured["latency_ms"]
    direct = statistics.median(latency["direct"])
    for arm, values in latency.items():
        ordered = sorted(values)
        p95 = ordered[int(0.95 * (len(ordered) - 1))]
        median = statistics.median(values)
        added = median - direct if arm == "gateway" else float("nan")
        call = "its /check" if arm == "verifier" else "get-run"
        rows.append([f"{arm}: {call}", median, p95, added, float("nan"), float("nan")])
        flat += [{"arm": arm, "what": "latency_ms", "value": v} for v in values]
    reply = measured["reply"]
    seconds = {arm: statistics.median(v) for arm, v in reply["seconds"].items()}
    for arm, taken in seconds.items():
        rate = reply["bytes"] / taken / 1e6
        slower = taken / seconds["direct"]
        rows.append([f"{arm}: reply", float("nan"), float("nan"), float("nan"), rate, slower])
        flat += [{"arm": arm, "what": "reply_s", "value": v} for v in reply["seconds"][arm]]
    return rows, flat


def plot(path: Path, latency_ms: dict[str, list[float]]) -> None:
    """Each arm's latencies as a box: the gateway's added time against its spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.boxplot(list(latency_ms.values()), tick_labels=list(latency_ms), showfliers=False)
    ax.set(ylabel="ms per signed get-run call", title="Fleet call latency by way in")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overhead.gateway_overhead")
    common_arguments(parser, NAME, "30 calls and a 100 MB reply, once")
    parser.add_argument("--calls", type=int, default=300, help="signed get-run calls per arm")
    parser.add_argument("--repeats", type=int, default=3, help="replies per arm")
    parser.add_argument("--reply-mb", type=int, default=0, help="reply size (0: llama:350m)")
    args = parse_quick(parser, argv, calls=30, repeats=1, reply_mb=100)
    with tempfile.TemporaryDirectory(prefix="dept-gateway-bench-") as folder:
        measured = run(args, Path(folder))
    rows, flat = summarise(measured)
    reply = measured["reply"]
    title = (
        f"Fleet calls through the gateway (dept gateway-auth + nginx) against straight to the "
        f"SuperLink; reply {reply['bytes'] / 1e6:,.0f} MB in {reply['chunks']} chunks"
    )
    columns = ["arm", "median ms", "p95 ms", "added ms", "reply MB/s", "reply time x direct"]
    table = print_table(title, columns, rows)
    result = {**result_header(NAME, args, None), **measured, "table": table}
    write_outputs(args.out, NAME, result, flat)
    plot(args.out / f"{NAME}.png", measured["latency_ms"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
