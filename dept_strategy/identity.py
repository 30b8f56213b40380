"""Which node key may serve which source: the pins of ``source-keys-file``.

With SuperNode authentication every node proves it holds the private key of a public key
registered with the SuperLink, and the ServerApp sees that public key per node
(``Grid.get_nodes``). Pinning a source to a key means only the node holding it serves that
source, so a stranger with a registered key of their own (or a second node of the
operator's, misconfigured) cannot take the source over. The file maps source names to
OpenSSH public keys (the ``.pub`` files ``dept-certs`` writes, or their text)::

    de-novels: supernodes/de-novels.pub     # relative to this file
    ru-chekhov: ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTIt...
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import yaml
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from flwr.serverapp import Grid

from dept.config import ConfigError

KEY = "source-keys-file"


def load_source_keys(path: Path) -> dict[str, bytes]:
    """``{source: DER public key}`` from a pins file; a :class:`ConfigError` naming the file
    and the entry for anything that is not a readable public key."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config key '{KEY}': cannot read {path}: {exc}".splitlines()[0]) from exc
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"config key '{KEY}': {path} must map source names to public keys")
    return {str(source): _public_key(path, str(source), value) for source, value in data.items()}


def _public_key(path: Path, source: str, value: object) -> bytes:
    text = str(value).strip()
    if not text.startswith(("ssh-", "ecdsa-")):  # a path to a .pub file
        key_file = Path(text).expanduser()
        key_file = key_file if key_file.is_absolute() else path.parent / key_file
        try:
            text = key_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config key '{KEY}': {path}, source {source}: {exc}") from exc
    try:
        key = serialization.load_ssh_public_key(text.encode())
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"config key '{KEY}': {path}, source {source}: not an OpenSSH public key ({exc})"
        ) from exc
    return _der(key)


def _der(key: object) -> bytes:
    return key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def node_keys(grid: Grid) -> dict[int, bytes]:
    """``{node: its key}`` of the connected nodes: the DER public key a node authenticated
    with, or the SuperLink's bytes as they are where they are no key (the simulation gives
    every node random ones), so they still tell nodes apart and never match a pin."""
    found = {}
    for info in grid.get_nodes():
        if info.public_key:
            found[int(info.node_id)] = _normalised(bytes(info.public_key))
    return found


def _normalised(pem: bytes) -> bytes:
    try:
        return _der(serialization.load_pem_public_key(pem))
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return pem


def fingerprint(key: bytes) -> str:
    """``SHA256:...`` as ``ssh-keygen -l`` prints it (of the bytes, for what is no key)."""
    try:
        blob = _ssh_blob(key)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        blob = key
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _ssh_blob(der: bytes) -> bytes:
    ssh = serialization.load_der_public_key(der).public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return base64.b64decode(ssh.split()[1])
