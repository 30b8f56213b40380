"""``dept run``: ``flwr run`` on Ray's simulation or a federation of processes
(:mod:`server_app.process_federation`), sized for this run and this machine.

What it does is :data:`DESCRIPTION`, which ``--help`` prints with the run config keys.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click

from dept.cli_help import add_run_config_option
from dept.config import ConfigError, config_keys, load_config
from dept.data.sources import check_source_paths, run_sources
from dept.model.families import model_choice
from dept.paths import default_state_root, resolve_path
from dept.state.disks import disk_note
from dept.state.lock import check_folder_free, release_lock
from server_app.app_bundle import staged_app
from server_app.config_pairs import pairs_text, parse_pairs
from server_app.launch_clock import LAUNCHED_AT_VARIABLE, process_started_at, stamped
from server_app.local_runtime import HTTP_PORT_VARIABLE, LocalRuntime, Stopped, stop_signals
from server_app.process_federation import PROFILE, ProcessFederation, plan_nodes
from server_app.resume import (
    RESUME_OPTIONS,
    check_no_earlier_run,
    check_resumable,
    resume_hint,
    resume_overrides,
)
from server_app.run_log import relay
from server_app.run_status import DEBUG_VARIABLE, STATUS_FILE, one_line, read_status
from server_app.sizing import (
    ClientShare,
    check_fits_here,
    client_gpus,
    client_share,
    machine_cores,
    visible_gpus,
)

PATH_KEYS = ("sources-file", "output-dir", "state-dir")
FLOWER_HOME = ".flwr"  # the run's own Flower home, in its output folder
APP_FOLDER = "app"  # in it: the app's files flwr run bundles (server_app.app_bundle)
PROCESSES_FOLDER = "processes"  # in it: the federation of processes' logs, workers, profile
FEDERATIONS = ("auto", "processes", "ray")
RUN_LOG = "run.log"  # with --no-stream
HELP_WIDTH = 79
LOW_DISK = 16 << 20  # free bytes below which a run's missing status is put down to its disk
INDENT = " " * 6  # of a run config key's doc under its name
DESCRIPTION = """\
Run DEPT on this machine: flwr run in the simulation runtime (Ray), or a SuperLink
and one SuperNode process per source (--federation processes, no Ray: the
default where GPUs are visible or Ray is not installed), sized for this run and
machine.

Plain "flwr run ." starts two simulated SuperNodes, hides GPUs from ClientApps
and shares one background SuperLink (fixed ports) with every user of the
machine. dept run validates the run config, sources and output folder first (a
typo fails in a second, naming the key), starts one SuperNode per source, gives
each client an equal share of the visible GPUs and of the CPU cores (its torch
threads), so as many train at once as the machine holds, makes relative paths absolute,
runs its own SuperLink on free loopback ports with its own Flower home
(OUTPUT_DIR/.flwr; FLWR_HOME and FLWR_LOCAL_SUPERLINK_HTTP_API_PORT are
honoured), turns off Flower's per-run dependency installation (it would
download a CUDA build of torch), streams the logs, and stops every process the
run started when it ends. Ctrl-C or SIGTERM stops the run within 30 s and says
which round it can resume after; --resume continues it.

exit codes: 0 finished; 1 the run failed; 2 bad config, sources or folder;
130 (SIGINT) or 143 (SIGTERM) stopped."""
EXAMPLES = """\
examples:
  dept run -c "variant='spec' model='debug'" -c "num-server-rounds=2 output-dir='outputs/spec'"
  dept run -c "model='gpt2:tiny' variant='glob' compression='int8'" -c "seed=1" --no-stream
  dept run --resume outputs/spec                # after Ctrl-C: the same run goes on"""


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


def build_command(
    app: Path, run_config: dict[str, Any], num_nodes: int, share: ClientShare, stream: bool
) -> list[str]:
    """``flwr run`` in the simulation runtime (Ray), ``num_nodes`` clients each given ``share``."""
    federation = (
        f"num-supernodes={num_nodes} client-resources-num-gpus={share.gpus} "
        f"client-resources-num-cpus={share.cpus}"
    )
    command = ["flwr", "run", str(app), "--federation-config", federation]
    command += ["--run-config", pairs_text(run_config)]
    return [*command, "--stream"] if stream else command


def processes_command(app: Path, run_config: dict[str, Any]) -> list[str]:
    """``flwr run`` against the federation of processes' SuperLink (its profile)."""
    overrides = pairs_text(run_config)
    return ["flwr", "run", str(app), PROFILE, "--run-config", overrides, "--stream"]


def federation_kind(asked: str, gpus: int) -> str:
    """The runtime ``auto`` stands for on this machine: processes where Ray is missing or
    GPUs are to be shared (Ray's fractional GPUs are Flower's most reported simulation
    failure), else Ray, whose actors start once and answer each message without a new
    process."""
    if asked != "auto":
        return asked
    if gpus or importlib.util.find_spec("ray") is None:
        return "processes"
    return "ray"


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
    add_run_config_option(
        parser,
        "run config overrides, as for flwr run (TOML values; repeatable; "
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
        "--federation",
        choices=FEDERATIONS,
        default="auto",
        help="how the nodes run: 'processes', a SuperLink and one SuperNode process per "
        "source on loopback (no Ray; a node that dies is restarted), or 'ray', Flower's "
        "simulation runtime (default 'auto': processes where GPUs are visible or Ray is "
        "not installed, else ray)",
    )
    parser.add_argument(
        "--gpus-per-client",
        type=float,
        default=None,
        metavar="SHARE",
        help="GPUs per client (default: the visible GPUs shared equally, 0 if none)",
    )
    parser.add_argument(
        "--no-stream",
        action="store_true",
        help=f"write the run's log to OUTPUT_DIR/{RUN_LOG} instead of the terminal "
        "(default: the terminal)",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="OUTPUT_DIR",
        help="continue the run checkpointed in OUTPUT_DIR with its own config; -c may "
        f"change only {', '.join(sorted(RESUME_OPTIONS))}",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="start a new run in an OUTPUT_DIR that holds one already (its checkpoints are "
        "replaced; default: refused)",
    )
    parser.add_argument(
        "--keep-superlink",
        action="store_true",
        help="leave this run's local SuperLink running after the run (default: stop it)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show tracebacks, here and in the ServerApp's log (default: one line per error)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _launch(args)
    except (ConfigError, click.ClickException) as exc:
        print(f"dept run: error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.debug:
            raise
        print(f"dept run: error: {one_line(exc)} (--debug shows where)", file=sys.stderr)
        return 1


def _launch(args: argparse.Namespace) -> int:
    """Check everything that can be checked here, then run ``flwr run`` on this run's own
    local runtime; the exit code says how the run ended."""
    app = (args.app or project_dir()).resolve()
    given = parse_pairs(args.run_config, "-c")
    if args.resume:
        overrides = resume_overrides(args.resume.resolve(), absolute_paths(given))
    else:
        overrides = absolute_paths({**_path_defaults(app), **given})
    cfg = load_config(app_defaults(app), overrides=overrides)
    out_dir = resolve_path(cfg.output_dir)
    sources = run_sources(cfg)
    check_source_paths(sources)
    check_folder_free(out_dir)  # usable, and no other run in it
    if cfg.resume:
        check_resumable(cfg, out_dir)
    else:
        check_no_earlier_run(out_dir, args.force)
    check_fits_here(cfg, sources)
    num_nodes = args.num_supernodes or len(sources)
    visible = visible_gpus(cfg)
    gpus = (
        client_gpus(num_nodes, visible, sources)
        if args.gpus_per_client is None
        else args.gpus_per_client
    )
    share = client_share(num_nodes, gpus, visible, machine_cores())
    runtime = LocalRuntime.for_run(out_dir / FLOWER_HOME, dict(os.environ))
    # --stream also makes flwr run wait for the run's end, which dept run needs
    bundled = staged_app(app, out_dir / FLOWER_HOME / APP_FOLDER)  # not the whole checkout
    env = runtime.env(dict(os.environ))
    env[LAUNCHED_AT_VARIABLE] = repr(process_started_at())  # rounds count from the command
    if args.debug:
        env[DEBUG_VARIABLE] = "1"
    federation = None
    if federation_kind(args.federation, visible) == "processes":
        root = out_dir / FLOWER_HOME / PROCESSES_FOLDER
        plans = plan_nodes(sources, num_nodes, visible, machine_cores(), root)
        federation = ProcessFederation(root, runtime, plans, env)
        if not cfg.resume:  # round 0 waits for every node (a resumed run, for its sources)
            overrides = {"min-available-nodes": min(num_nodes, len(sources)), **overrides}
        command = processes_command(bundled, overrides)
        env = federation.flwr_env()
        print(
            stamped(
                f"dept run: {num_nodes} SuperNode processes (no Ray); SuperLink on "
                f"{federation.address}; node logs in {federation.logs}; outputs in "
                f"{cfg.output_dir}\n{federation.describe()}"
            ),
            flush=True,
        )
    else:
        command = build_command(bundled, overrides, num_nodes, share, stream=True)
        print(
            stamped(
                f"dept run: {num_nodes} SuperNodes, {share.describe()}; SuperLink on 127.0.0.1:"
                f"{runtime.http_port}; outputs in {cfg.output_dir}"
            ),
            flush=True,
        )
    print(stamped(f"dept run: {state_line(cfg.state_dir)}"), flush=True)
    started = time.time()
    with stop_signals(), _log_to(out_dir / RUN_LOG if args.no_stream else None) as output:
        try:
            with _nodes(federation, output):
                code = _flwr_run(command, env, output)
        except Stopped as stop:
            return _stopped(stop, runtime, out_dir)
        finally:
            if not args.keep_superlink:
                runtime.stop()
    if args.keep_superlink:
        print(
            f"dept run: the SuperLink stays on 127.0.0.1:{runtime.http_port} "
            f"(FLWR_HOME={runtime.flwr_home} {HTTP_PORT_VARIABLE}={runtime.http_port})"
        )
    return exit_code(out_dir, started, code)


@contextlib.contextmanager
def _nodes(federation: ProcessFederation | None, output: IO[str]) -> Iterator[None]:
    """The federation of processes started and supervised while the block runs (nothing
    for the Ray simulation, which ``flwr run`` starts itself)."""
    if federation is None:
        yield
        return

    def say(line: str) -> None:
        print(stamped(f"dept run: {line}"), file=output, flush=True)

    federation.start()
    with federation.supervise(say):
        yield


@contextlib.contextmanager
def _log_to(path: Path | None) -> Iterator[IO[str]]:
    """The file the run's log goes to, or the terminal."""
    if path is None:
        yield sys.stdout
        return
    with path.open("w") as log:
        yield log


def _flwr_run(command: list[str], env: dict[str, str], output: IO[str]) -> int:
    """Run ``command`` in a session of its own (Ctrl-C reaches dept run, which stops the
    whole run), its output relayed to ``output``; its exit code."""
    process = subprocess.Popen(
        command,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert process.stdout is not None
    try:
        relay(process.stdout, output)
        return process.wait()
    finally:  # on Stopped, the caller stops the rest of the run
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


def state_line(state_dir: str) -> str:
    """Where the nodes keep tokenizers, token caches and round state, said at every start:
    the default is shared by all of the user's runs."""
    if state_dir:
        return f"state: {state_dir} (config key state-dir)"
    home = str(default_state_root()).replace(str(Path.home()), "~", 1)
    return f"state: {home} (shared by your runs; state-dir='...' to change)"


def _stopped(stop: Stopped, runtime: LocalRuntime, out_dir: Path) -> int:
    """Stop every process of the run; one line says what can be resumed. Once they are all
    gone the folder's lock is let go as a clean end would: its holder was stopped, not
    crashed, so the resume that follows has no stale lock to report."""
    left = runtime.stop()
    if not left:
        release_lock(out_dir)
    resume = resume_hint(out_dir) or "no round was checkpointed, so a new run starts from scratch"
    alive = f"; still alive: pids {', '.join(str(p.pid) for p in left)}" if left else ""
    print(f"\ndept run: stopped by {stop.name}{alive}; {resume}", file=sys.stderr, flush=True)
    return 128 + stop.signum


def exit_code(out_dir: Path, started: float, code: int) -> int:
    """``flwr run`` exits 0 however the run ended; the run's status file says how."""
    status = read_status(out_dir, started)
    if status is not None and status.state == "finished":
        return code
    if status is None and out_dir.is_dir() and shutil.disk_usage(out_dir).free < LOW_DISK:
        why = f"{disk_note(out_dir)}: the run could not write {STATUS_FILE} there"
    elif status is None:
        why = f"the run ended without writing {out_dir / STATUS_FILE} (see the log above)"
    else:
        why = status.error
    hint = "" if status and status.config_error else resume_hint(out_dir)
    advice = f"; {hint}" if hint else ""
    print(f"dept run: error: {why}{advice}", file=sys.stderr)
    return code or 1


def _path_defaults(app: Path) -> dict[str, Any]:
    """The app's default path keys, so they too resolve against the caller's directory."""
    defaults = app_defaults(app)
    return {k: defaults[k] for k in PATH_KEYS if defaults.get(k)}


if __name__ == "__main__":
    sys.exit(main())
