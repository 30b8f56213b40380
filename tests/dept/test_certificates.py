"""dept-certs: a CA, a SuperLink certificate for the given names, SuperNode key pairs that
Flower accepts, and no silent overwrite."""

from __future__ import annotations

import ipaddress
import os
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.cli.supernode.register import try_load_public_key

from dept.certificates import EXAMPLES, SECRET_FILE, main, make_certificates
from tests.command_examples import doc_examples

PROJECT = Path(__file__).resolve().parents[2]


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


def test_every_private_file_is_owner_only_from_its_creation(tmp_path: Path) -> None:
    # A name with a dot ("de.novels") has a file suffix; a world-readable file already there
    # (replaced with --force) must not lend its mode to the new key.
    (tmp_path / "supernodes").mkdir(parents=True)
    stale = tmp_path / "supernodes" / "de.novels"
    stale.write_text("old")
    stale.chmod(0o644)
    old_umask = os.umask(0)
    try:
        make_certificates(tmp_path, ["localhost"], ["de.novels"], force=True)
    finally:
        os.umask(old_umask)
    for name in ("ca.key", "server.key", SECRET_FILE, "supernodes/de.novels"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name
    assert (tmp_path / "supernodes" / "de.novels.pub").stat().st_mode & 0o077 != 0
    assert len((tmp_path / SECRET_FILE).read_bytes()) == 64


@pytest.mark.parametrize("name", ["../escaped", "a/b", ".hidden", "a..b", "", "x.pub"])
def test_a_supernode_name_that_is_not_a_plain_file_name_is_refused(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        make_certificates(tmp_path / "certs", ["localhost"], [name])
    assert not (tmp_path / "escaped").exists()
    assert not (tmp_path / "certs").exists(), "nothing is written before the names are checked"


def test_certificates_under_docker_are_ignored_by_git() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "docker/certs/ca.key"], cwd=PROJECT, check=False
    )
    assert ignored.returncode == 0


def test_every_example_of_the_help_runs_as_printed_into_a_folder_of_its_own(
    tmp_path: Path,
) -> None:
    # the help's, and the docs' that name no placeholder (``<public host name>``)
    shown = [*EXAMPLES.splitlines()[1:], *doc_examples()]
    commands = [line.split() for line in shown if line.strip().startswith("dept certs ")]
    commands = [c for c in commands if not any(w.startswith("<") for w in c)]
    assert len(commands) == 3

    for number, command in enumerate(commands):
        assert command[:2] == ["dept", "certs"]
        folder = tmp_path / str(number)  # in place of the example's own folder
        assert main([str(folder), *command[3:]]) == 0, command
        nodes = command[command.index("--supernodes") + 1].split(",")
        assert sorted(p.name for p in (folder / "supernodes").glob("*.pub")) == sorted(
            f"{node}.pub" for node in nodes
        )
        assert (folder / "server.pem").is_file() and (folder / SECRET_FILE).is_file()
