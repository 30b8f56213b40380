"""``dept run``: ``flwr run`` in the simulation runtime, sized for this run and this machine.

What it does is :data:`DESCRIPTION`, which ``--help`` prints with the run config keys.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path
from typing import Any

import click
import httpx
from flwr.common.config import parse_config_args

from dept.budget import Device, check_server_fits, check_source_fits
from dept.config import ConfigError, DeptConfig, config_keys, load_config, resolve_path
from dept.lock import check_folder_free
from dept.model import model_choice
from dept.sharing import shared_vocab_size
from dept.sources import SourceSpec, run_sources
from dept.train import resolve_device

PATH_KEYS = ("sources-file", "output-dir", "state-dir")
LOCAL_SUPERLINK_HEALTH = "http://127.0.0.1:39091/health"
HELP_WIDTH = 79
INDENT = " " * 6  # of a run config key's doc under its name
DESCRIPTION = """\
Run DEPT: flwr run in the simulation runtime, sized for this run and machine.

Plain "flwr run ." starts two simulated SuperNodes and hides GPUs from
ClientApps unless told otherwise. dept run validates the run config first (a
typo fails in a second, naming the key), starts one SuperNode per source, gives
each client an equal share of the visible GPUs, makes relative paths absolute
against your working directory (the local SuperLink may have been started
elsewhere), turns off Flower's per-run dependency installation (it would
download a CUDA build of torch), streams the logs, and stops the local
SuperLink it started when the run ends."""
EXAMPLES = """\
examples:
  dept run -c "model='debug' num-server-rounds=2 output-dir='runs/debug'"
  dept run -c "model='gpt2:tiny' variant='glob' compression='int8'" -c "seed=1" --no-stream"""


def project_dir() -> Path:
    """The app folder: the working dir if it is one, else this installed project's root."""
    cwd = Path.cwd()
    if _is_flower_app(cwd):
        return cwd
    root = Path(__file__).resolve().parents[1]
    if _is_flower_app(root):
        return root
    raise SystemExit("dept run: no Flower app here; run it from the project folder or pass --app")


def _is_flower_app(folder: Path) -> bool:
    pyproject = folder / "pyproject.toml"
    return (
        pyproject.is_file()
        and "tool" in (data := tomllib.loads(pyproject.read_text()))
        and "flwr" in data["tool"]
    )


def app_defaults(app: Path) -> dict[str, Any]:
    return tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def absolute_paths(config: dict[str, Any]) -> dict[str, Any]:
    """Relative path values made absolute against the caller's working directory (``model``
    too where it names a config file, not a preset)."""
    return {
        k: str(resolve_path(v, Path.cwd())) if v and _is_path(k, v) else v
        for k, v in config.items()
    }


def _is_path(key: str, value: Any) -> bool:
    if key == "model":
        try:
            return model_choice(str(value)).from_file
        except ValueError:  # load_config names the problem
            return False
    return key in PATH_KEYS


def gpu_share(num_clients: int) -> float:
    """Fraction of a GPU per client so that all clients fit on the visible GPUs at once."""
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        gpus = 0
    return math.floor(min(1.0, gpus / num_clients) * 10_000) / 10_000 if gpus else 0.0


def build_command(
    app: Path, run_config: dict[str, Any], num_nodes: int, gpus: float, stream: bool
) -> list[str]:
    overrides = " ".join(f"{k}={_toml(v)}" for k, v in run_config.items())
    federation = f"num-supernodes={num_nodes} client-resources-num-gpus={gpus}"
    command = [
        "flwr",
        "run",
        str(app),
        "--federation-config",
        federation,
        "--run-config",
        overrides,
    ]
    return [*command, "--stream"] if stream else command


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: quotes and backslashes escaped
    return repr(value)


def _superlink_running() -> bool:
    try:
        return httpx.get(LOCAL_SUPERLINK_HEALTH, timeout=1.0).is_success
    except httpx.HTTPError:
        return False


def stop_local_superlink() -> None:
    """Stop the background SuperLink that ``flwr run`` started for the simulation."""
    flwr_home = os.environ.get("FLWR_HOME") or str(Path.home() / ".flwr")
    found = subprocess.run(
        ["pgrep", "-f", f"flower-superlink.*{flwr_home}/local-superlink"],
        capture_output=True,
        text=True,
        check=False,
    )
    for pid in found.stdout.split():
        os.kill(int(pid), signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _superlink_running() and time.monotonic() < deadline:
        time.sleep(0.2)


def check_fits_here(cfg: DeptConfig, sources: list[SourceSpec]) -> None:
    """The server and every client of this simulation fit this machine (:mod:`dept.budget`)."""
    check_server_fits(cfg, shared_vocab_size(cfg), Device.here("cpu").memory)
    device = Device.here(resolve_device(cfg.device).type)
    for spec in sources:
        check_source_fits(cfg, spec, device)


def keys_help() -> str:
    """The run config keys for ``--help``: ``key = default  [type or choices]``, then the doc."""
    lines = ['run config keys (-c "key=value", strings quoted: -c "model=\'debug\'"):']
    for k in config_keys():
        lines.append(f"  {k.key} = {k.shown_default}  [{k.kind}]")
        lines += textwrap.wrap(
            k.doc,
            HELP_WIDTH,
            initial_indent=INDENT,
            subsequent_indent=INDENT,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """dept run's options; the help ends with examples and every run config key."""
    parser = argparse.ArgumentParser(
        prog="dept run",
        description=DESCRIPTION,
        epilog=f"{EXAMPLES}\n\n{keys_help()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--run-config",
        "-c",
        action="append",
        default=[],
        metavar='"KEY=VALUE ..."',
        help="run config overrides, as for flwr run (TOML values; repeatable; "
        "default: the app's pyproject.toml, keys below)",
    )
    parser.add_argument(
        "--app",
        type=Path,
        default=None,
        metavar="DIR",
        help="the Flower app folder (default: the working directory if it is one, "
        "else this installed project)",
    )
    parser.add_argument(
        "--num-supernodes",
        type=int,
        default=0,
        metavar="N",
        help="simulated SuperNodes (default: one per source)",
    )
    parser.add_argument(
        "--gpus-per-client",
        type=float,
        default=None,
        metavar="SHARE",
        help="GPUs per client (default: the visible GPUs shared equally, 0 if none)",
    )
    parser.add_argument(
        "--no-stream", action="store_true", help="do not stream the run's logs (default: stream)"
    )
    parser.add_argument(
        "--keep-superlink",
        action="store_true",
        help="leave the local SuperLink running after the run (default: stop it if "
        "dept run started it)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    app = (args.app or project_dir()).resolve()
    try:
        overrides = absolute_paths({**_path_defaults(app), **parse_config_args(args.run_config)})
        cfg = load_config(app_defaults(app), overrides=overrides)
        sources = run_sources(cfg)
        num_nodes = args.num_supernodes or len(sources)
        check_folder_free(resolve_path(cfg.output_dir))  # usable, and no other run in it
        check_fits_here(cfg, sources)
    except (ConfigError, click.ClickException) as exc:
        print(f"dept run: error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    gpus = gpu_share(num_nodes) if args.gpus_per_client is None else args.gpus_per_client
    command = build_command(app, overrides, num_nodes, gpus, stream=not args.no_stream)
    print(
        f"dept run: {num_nodes} SuperNodes, {gpus} GPU each; outputs in {cfg.output_dir}",
        flush=True,
    )
    was_running = _superlink_running()
    env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    started = time.time()
    try:
        code = subprocess.run(command, env=env, check=False).returncode
    finally:
        if not was_running and not args.keep_superlink:
            stop_local_superlink()
    return code or _finished(resolve_path(cfg.output_dir), started)


def _finished(out_dir: Path, started: float) -> int:
    """``flwr run`` exits 0 even when the run died; a run finished if it wrote its summary."""
    summary = out_dir / "summary.json"
    if summary.is_file() and summary.stat().st_mtime >= started:
        return 0
    print(
        f"dept run: error: the run ended without writing {summary} (see the log above); "
        'continue it with -c "resume=true" and the same settings',
        file=sys.stderr,
    )
    return 1


def _path_defaults(app: Path) -> dict[str, Any]:
    """The app's default path keys, so they too resolve against the caller's directory."""
    defaults = app_defaults(app)
    return {k: defaults[k] for k in PATH_KEYS if defaults.get(k)}


if __name__ == "__main__":
    sys.exit(main())
