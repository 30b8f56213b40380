"""``dept certs``: the TLS certificates and SuperNode keys a secure deployment needs.

Writes, into one folder:

- ``ca.crt`` / ``ca.key``: a private certificate authority (keep ``ca.key`` offline);
- ``server.pem`` / ``server.key``: the SuperLink's certificate, signed by the CA, valid for
  every name and address the SuperNodes, SuperExecs and ``flwr`` use to reach it;
- ``supernodes/<name>`` / ``supernodes/<name>.pub``: one ECDSA (P-384) key pair per SuperNode
  in OpenSSH format, for SuperNode authentication: the SuperNode starts with the private key,
  and the public key is registered with ``flwr supernode register``;
- ``superexec.secret``: a random shared secret for ``--superexec-auth-secret-file``, so only
  the executors given it can take tasks from a SuperLink's or SuperNode's Runtime API.

Private keys and the secret are created owner-only (0600) before a byte is written, so they
are never readable by others, not even for an instant.

Python's ``cryptography`` (already a Flower dependency) does the work, so the script runs
wherever the project is installed, without an ``openssl`` binary. Existing files are never
overwritten unless ``--force`` is given: a CA that signed running deployments is not lost
by a second call.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import re
import secrets
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dept.cli_help import HelpFormatter

DEFAULT_NAMES = ("localhost", "127.0.0.1", "::1", "superlink")
VALID_DAYS = 365
SECRET_FILE = "superexec.secret"
# A SuperNode name becomes a file name: no separators, no leading dot, no "..".
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _alt_name(value: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        return x509.DNSName(value)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certificates(
    out: Path, names: list[str], supernodes: list[str], *, force: bool = False
) -> list[Path]:
    """Write the CA, the SuperLink certificate for ``names`` and one key pair per SuperNode;
    returns the files written. Refuses (FileExistsError) to replace files unless ``force``."""
    keys_dir = out / "supernodes"
    for node in supernodes:
        if not NODE_NAME.fullmatch(node) or ".." in node or node.endswith(".pub"):
            raise ValueError(
                f"SuperNode name {node!r} is not a plain file name (letters, digits, '.', '_', "
                "'-'; no separators, no leading dot, no '..', no '.pub' ending)"
            )
    files = {
        out / "ca.crt",
        out / "ca.key",
        out / "server.pem",
        out / "server.key",
        out / SECRET_FILE,
        *(keys_dir / n for n in supernodes),
        *(keys_dir / f"{n}.pub" for n in supernodes),
    }
    if not force and (present := sorted(str(f) for f in files if f.exists())):
        raise FileExistsError(
            f"refusing to overwrite {', '.join(present)} (pass --force to replace them)"
        )
    if not names:
        raise ValueError("at least one SuperLink name or address is needed (--name)")
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = _name("DEPT-on-Flower CA")
    ca = _certificate(
        ca_name,
        ca_key,
        ca_name,
        ca_key,
        [(x509.BasicConstraints(ca=True, path_length=0), True)],
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = _certificate(
        _name(names[0]),
        server_key,
        ca_name,
        ca_key,
        [
            (x509.SubjectAlternativeName([_alt_name(n) for n in names]), False),
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        ],
    )
    public = {
        out / "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        out / "server.pem": server.public_bytes(serialization.Encoding.PEM),
    }
    private = {
        out / "ca.key": _pem_key(ca_key),
        out / "server.key": _pem_key(server_key),
        out / SECRET_FILE: secrets.token_hex(32).encode(),
    }
    for node in supernodes:
        key = ec.generate_private_key(ec.SECP384R1())
        private[keys_dir / node] = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        public[keys_dir / f"{node}.pub"] = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    for path, data in private.items():
        write_private(path, data)
    for path, data in public.items():
        path.write_bytes(data)
    return sorted([*private, *public])


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new owner-only file (0600 from its creation; a file already there
    is replaced, not reused, since its old mode might let others read it)."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as f:
        f.write(data)


EXAMPLES = """examples:
  dept certs ~/dept-certs --name superlink.example.org --supernodes de-novels,ru-chekhov
  dept certs docker/certs --name superlink --name gateway --name 127.0.0.1 --supernodes node-1
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dept certs",
        description="Make the TLS certificates and SuperNode authentication keys of a deployment.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("out", type=Path, help="folder to write into (created if missing)")
    parser.add_argument(
        "--name",
        action="append",
        dest="names",
        help="a DNS name or IP address the SuperLink is reached at (repeat; default: "
        f"{', '.join(DEFAULT_NAMES)})",
    )
    parser.add_argument(
        "--supernodes",
        default="",
        help="comma-separated SuperNode names to make authentication key pairs for",
    )
    parser.add_argument("--force", action="store_true", help="replace existing files")
    args = parser.parse_args(argv)
    supernodes = [n.strip() for n in args.supernodes.split(",") if n.strip()]
    try:
        written = make_certificates(
            args.out, args.names or list(DEFAULT_NAMES), supernodes, force=args.force
        )
    except (FileExistsError, ValueError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
