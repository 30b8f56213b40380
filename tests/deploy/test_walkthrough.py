"""docs/deployment.md's "From zero to a two-machine run", every block as printed, on one
machine made to look like the docs' two: a network, mounts and processes of its own
(``unshare``) over a copy-on-write view of this machine's files (overlayfs), in which
``superlink.example.org`` is this machine, ``/home/me`` is the server's home, ``/data`` and
``/var/lib/dept`` the source machine's folders, and nginx's ``/etc/nginx/conf.d`` the
system's. Nothing written there reaches the real files; the namespace's end stops every
process the walk-through started.

Between the blocks the test does what the reader does: waits for what was started to
come up, and copies ``ca.crt`` and the node's key to the source machine's folder. systemd
does not run here, so ``systemctl`` is a stand-in that starts or reloads nginx. The
50-round ``small`` run is stopped once its first training round is done: a node that dialled
the gateway by its public name, registered, trained and sent a signed update."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.overhead.data_scaling import write_source
from tests.helpers import LOOPBACK_UP, fenced_block, needs_own_network

pytestmark = [pytest.mark.slow, needs_own_network]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deployment.md"
SECTION = "## From zero to a two-machine run (TLS, SuperNode authentication, gateway)"
TRAINED = "round 1/50 done: avg val bpb [0-9]"  # grep -E's
ONLINE = """flwr supernode ls server --format json 2>/dev/null | grep -q '"status": "online"'"""
WALK_S = 600

SYSTEMCTL = """#!/bin/sh
# systemd's systemctl, for 'reload nginx' only: start nginx, or reload it
[ "$*" = "reload nginx" ] || { echo "test stand-in: systemctl $*" >&2; exit 1; }
if [ -s /run/nginx.pid ] && kill -0 "$(cat /run/nginx.pid)" 2>/dev/null; then
    exec nginx -s reload
fi
exec nginx
"""


def section_blocks(doc: Path, heading: str) -> list[str]:
    """The bash blocks under ``heading``, up to the next heading of its level, as printed."""
    text = doc.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else None]
    return re.findall(r"^```bash\n(.*?)^```$", section, re.S | re.M)


def _wait_for(what: str, test: str, seconds: int = 90) -> str:
    """Shell lines that wait until ``test`` holds, or fail naming ``what``."""
    return (
        f"end=$((SECONDS + {seconds}))\n"
        f"until {test}; do\n"
        f"  [ $SECONDS -lt $end ] || {{ echo 'walk-through: {what} never came up' >&2; exit 1; }}\n"
        "  sleep 0.5\ndone\n"
    )


def walkthrough(tmp_path: Path) -> str:
    """The script the namespace runs inside its view of the files (``chroot``)."""
    server, certs_at_tls, auth, source, run = section_blocks(DOC, SECTION)
    profiles = fenced_block(DOC, "## Connection profiles", "toml")
    venv = Path(sys.executable).parent
    return "\n".join(
        [
            "set -euo pipefail",
            f"export HOME=/home/me PATH={shlex.quote(str(venv))}:/usr/local/sbin:$PATH",
            "unset FLWR_HOME DEPT_HOME",
            "mkdir -p /home/me/.flwr /data",
            f"cp -r {tmp_path / 'de-novels'} /data/de-novels",
            f"cat > /home/me/.flwr/config.toml <<'TOML'\n{profiles}TOML",
            "# -- the server, in the checkout the project was installed from",
            f"cd {shlex.quote(str(ROOT))}",
            server,
            _wait_for("the SuperLink", "bash -c '</dev/tcp/127.0.0.1/8000' 2>/dev/null"),
            "# -- the gateway",
            certs_at_tls,
            _wait_for("the gateway", "bash -c '</dev/tcp/127.0.0.1/8443' 2>/dev/null"),
            "# -- registering the node's key",
            auth,
            "# -- the source machine: ca.crt and its key copied there",
            "mkdir /home/me/source-machine && cd /home/me/source-machine",
            "cp ~/dept-certs/ca.crt ~/dept-certs/supernodes/de-novels .",
            source,
            _wait_for(
                "the SuperNode",
                ONLINE,
            ),
            "# -- the run, from the checkout",
            f"cd {shlex.quote(str(ROOT))}",
            f"({run}) > /home/me/run.out 2>&1 &",
            f"for _ in $(seq {WALK_S}); do grep -Eq {shlex.quote(TRAINED)} /home/me/run.out"
            " && break; sleep 1; done",
            "cat /home/me/run.out",
            f"grep -Eq {shlex.quote(TRAINED)} /home/me/run.out",
            "flwr supernode ls server",
            f"cp ~/dept-runs/runs/remote-1/metrics.jsonl {shlex.quote(str(tmp_path))}",
            "echo walk-through: trained",
        ]
    )


def test_the_two_machine_walkthrough_runs_as_printed(tmp_path: Path) -> None:
    write_source(tmp_path / "de-novels", 600_000)  # the node's text: train.txt and val.txt
    (tmp_path / "inner.sh").write_text(walkthrough(tmp_path))
    outer = "\n".join(
        [
            "set -euo pipefail",
            f'"{sys.executable}" -c "{LOOPBACK_UP}"',
            f"cd {shlex.quote(str(tmp_path))}",
            # the writable layer on a tmpfs: overlayfs takes no upper layer on another overlay
            "mkdir -p layer view && mount -t tmpfs tmpfs layer && mkdir layer/upper layer/work",
            "mount -t overlay overlay -o lowerdir=/,upperdir=layer/upper,workdir=layer/work view",
            # every mount under / the view lacks (proc, dev, sys, tmp, this checkout's disk…)
            "findmnt -rno TARGET | awk -F/ 'NF==2 && $2!=\"\"' | while read -r m; do"
            ' if [ -d "view$m" ]; then mount --rbind "$m" "view$m"; fi; done',
            'mount --bind "$PWD" "view$PWD"  # this test\'s folder, shared with the view',
            "echo '127.0.0.1 superlink.example.org' > view/etc/hosts",
            f"printf %s {shlex.quote(SYSTEMCTL)} > view/usr/local/sbin/systemctl",
            "chmod +x view/usr/local/sbin/systemctl",
            "mkdir -p view/home/me",
            f"exec chroot view bash {shlex.quote(str(tmp_path / 'inner.sh'))}",
        ]
    )
    done = subprocess.run(
        ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "bash", "-c", outer],
        capture_output=True,
        text=True,
        timeout=WALK_S + 120,
    )
    said = done.stdout + done.stderr
    (tmp_path / "walk.log").write_text(said)  # whole, for a failure's reader
    assert done.returncode == 0 and "walk-through: trained" in said, said[-6000:]
    # what the run wrote under the ServerApp's $DEPT_HOME, copied out of the view
    assert '"round": 1' in (tmp_path / "metrics.jsonl").read_text()
