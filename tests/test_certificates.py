"""dept-certs: a CA, a SuperLink certificate for the given names, SuperNode key pairs that
Flower accepts, and no silent overwrite."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.cli.supernode.register import try_load_public_key

from dept.certificates import main, make_certificates


def test_server_certificate_is_signed_by_the_ca_for_every_name(tmp_path: Path) -> None:
    make_certificates(tmp_path, ["superlink", "10.0.0.5"], ["node-1"])
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["superlink"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    assert (tmp_path / "server.key").stat().st_mode & 0o077 == 0


def test_supernode_keys_load_as_flower_loads_them(tmp_path: Path) -> None:
    make_certificates(tmp_path, ["localhost"], ["node-1", "node-2"])
    for node in ("node-1", "node-2"):
        load_ssh_private_key((tmp_path / "supernodes" / node).read_bytes(), password=None)
        assert try_load_public_key(tmp_path / "supernodes" / f"{node}.pub")


def test_existing_files_are_kept_unless_forced(tmp_path: Path, capsys) -> None:
    make_certificates(tmp_path, ["localhost"], [])
    ca = (tmp_path / "ca.crt").read_bytes()
    assert main([str(tmp_path), "--name", "localhost"]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (tmp_path / "ca.crt").read_bytes() == ca
    assert main([str(tmp_path), "--name", "localhost", "--force"]) == 0
    assert (tmp_path / "ca.crt").read_bytes() != ca
    with pytest.raises(ValueError, match="name"):
        make_certificates(tmp_path / "x", [], [])
