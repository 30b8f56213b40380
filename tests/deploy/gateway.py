"""The nginx gateway of ``docker/gateway.conf.template``, run as a plain process by the tests.

The template is an http-context snippet (what the official nginx image includes from
``conf.d/``); here it is filled in with :class:`string.Template` and wrapped in a minimal main
config whose pid file, logs and temporary files all live in the test's own folder.
"""

from __future__ import annotations

import datetime
import grp
import os
import pwd
import shutil
from base64 import b64encode
from pathlib import Path
from string import Template

from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common.constant import TIMESTAMP_HEADER
from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER
from flwr.supercore.primitives.asymmetric import public_key_to_bytes, sign_message

TEMPLATE = Path(__file__).resolve().parents[2] / "docker" / "gateway.conf.template"
# nginx checks an upstream certificate against its DNS names only (dept-certs' defaults have it).
SUPERLINK_TLS_NAME = "localhost"
MAIN_CONFIG = """\
daemon off;
user {user} {group};
pid {folder}/nginx.pid;
error_log {folder}/error.log info;
events {{}}
http {{
    access_log {folder}/access.log;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    include {snippet};
}}
"""


def nginx() -> str | None:
    """The nginx binary; Debian puts it in /usr/sbin, which a non-root PATH may lack."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/local/sbin:/usr/sbin")


def render(listen: str, upstream: str, certs: Path, auth: str) -> str:
    """The template filled in for a SuperLink at ``upstream`` with dept-certs' ``certs`` and
    ``dept gateway-auth`` at ``auth``."""
    return Template(TEMPLATE.read_text()).safe_substitute(
        GATEWAY_LISTEN=listen,
        GATEWAY_AUTH=auth,
        GATEWAY_CERT=str(certs / "server.pem"),
        GATEWAY_KEY=str(certs / "server.key"),
        SUPERLINK_UPSTREAM=upstream,
        SUPERLINK_CA=str(certs / "ca.crt"),
        SUPERLINK_TLS_NAME=SUPERLINK_TLS_NAME,
    )


def write_config(folder: Path, listen: str, upstream: str, certs: Path, auth: str) -> Path:
    """The rendered snippet and a main config around it, in ``folder``; returns the latter.
    Workers run as the current user (ignored unless root), so they can enter the test's
    owner-only temporary folders."""
    folder.mkdir(parents=True, exist_ok=True)
    snippet = folder / "gateway.conf"
    snippet.write_text(render(listen, upstream, certs, auth))
    main = folder / "nginx.conf"
    user = pwd.getpwuid(os.geteuid()).pw_name
    group = grp.getgrgid(os.getegid()).gr_name
    main.write_text(MAIN_CONFIG.format(user=user, group=group, folder=folder, snippet=snippet))
    return main


def arguments(folder: Path, config: Path) -> list[str]:
    """nginx's command line for ``config``: ``-e`` so that not even the startup error log
    goes to the system's /var/log/nginx."""
    return ["-p", str(folder), "-e", str(folder / "error.log"), "-c", str(config)]


def signed_headers(
    key: ec.EllipticCurvePrivateKey,
    signer: ec.EllipticCurvePrivateKey | None = None,
    at: datetime.datetime | None = None,
) -> dict[str, str]:
    """What Flower's ``NodeAuthHttpInterceptor`` sends for ``key``: its public key, a
    timestamp (now, or ``at``) and the signature of that timestamp, by ``signer`` if given."""
    stamp = (at or datetime.datetime.now(tz=datetime.UTC)).isoformat()
    signature = sign_message(signer or key, stamp.encode("ascii"))
    return {
        FLEET_HTTP_PUBLIC_KEY_HEADER: b64encode(public_key_to_bytes(key.public_key())).decode(),
        TIMESTAMP_HEADER: stamp,
        FLEET_HTTP_SIGNATURE_HEADER: b64encode(signature).decode(),
    }
