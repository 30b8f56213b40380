"""Test helpers: a tiny valid run config, the devices tests run on, and the shared corpora."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import pytest
import torch
from flwr.app import ConfigRecord, Error, Message, RecordDict

from dept.config import DeptConfig, to_run_config
from dept.wire import keys

# A test parametrized over these runs on the CPU, and on CUDA where there is one.
DEVICES = ("cpu", pytest.param("cuda", marks=pytest.mark.gpu))
# How far the same training may drift on CUDA between two runs: SDPA's backward adds with
# atomics, in a different order each run, bf16 autocast widens that, and AdamW carries it into
# every later step. The CPU's kernels are deterministic (one thread here), so there equal
# inputs give equal bits. These bounds are not measured yet: no GPU was at hand.
CUDA_TOLERANCE = {"rtol": 1e-2, "atol": 1e-3}

# ../shared/corpora beside the checkout; DEPT_CORPORA points elsewhere.
CORPORA = Path(
    os.environ.get("DEPT_CORPORA") or Path(__file__).resolve().parents[2] / "shared" / "corpora"
)


def debug_run_config(tmp_path: Path, cache: Path | None = None, **overrides: Any) -> dict[str, Any]:
    """A complete, valid run config for the ``debug`` preset on the CPU, writing under
    ``tmp_path``; with ``cache`` (the ``node_cache`` fixture) its nodes share that cache
    (:func:`share_cache`). ``device='cuda'`` is for ``gpu`` tests."""
    config = to_run_config(DeptConfig())
    config.update(
        {
            "model": "debug",
            "device": "cpu",
            "seq-len": 64,
            "batch-size": 4,
            "num-server-rounds": 2,
            "local-steps": 8,
            "warmup-steps": 2,
            "eval-bytes": 8192,
            "output-dir": str(tmp_path / "out"),
            "state-dir": str(tmp_path / "state"),
            "wait-for-nodes-s": 5.0,
            # LocalGrid answers within push_messages; only a node made to stay silent is
            # waited for, and a second is enough to call it missing.
            "round-timeout-s": 1.0,
        }
    )
    config.update(overrides)
    if cache is not None:
        share_cache(Path(config["state-dir"]), cache)
    return config


def assert_same_training(
    got: Mapping[str, torch.Tensor | float], want: Mapping[str, torch.Tensor | float], device: str
) -> None:
    """Tensors (or numbers: bits per byte) two trainings of the same inputs gave on ``device``:
    equal bit for bit on the CPU, within :data:`CUDA_TOLERANCE` on CUDA."""
    assert got.keys() == want.keys()
    for name in want:
        a, b = (
            torch.as_tensor(v, dtype=torch.float64 if isinstance(v, float) else None).cpu()
            for v in (got[name], want[name])
        )
        if device == "cpu":
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a, b, **CUDA_TOLERANCE, msg=name)


def share_cache(state_dir: Path, cache: Path) -> Path:
    """``state_dir`` with its ``cache/`` (synthetic corpora, tokenizers, token streams) a link to
    ``cache``. Its entries are keyed by their inputs, so a run finds there what it would have
    built itself: tests that share it generate each corpus and train each tokenizer once."""
    state_dir.mkdir(parents=True, exist_ok=True)
    link = state_dir / "cache"
    if not link.is_symlink():
        link.symlink_to(cache, target_is_directory=True)
    return state_dir


def synthetic_sources(tmp_path: Path, *scripts: str, vocab_size: int = 400) -> Path:
    """A sources file of the built-in synthetic languages ``scripts`` (``latin``, ``greek``,
    ``cyrillic``...), each named ``synth-<script>`` with a vocabulary of ``vocab_size``."""
    path = tmp_path / "sources.yaml"
    path.write_text(
        "".join(
            f"- {{name: synth-{s}, path: 'builtin:synthetic-{s}', vocab-size: {vocab_size}}}\n"
            for s in scripts
        )
    )
    return path


def directory_app(sources_by_node: dict[int, list[str]]) -> Callable[[Message, Any], Message]:
    """A ClientApp stand-in that only answers discovery queries; unlisted nodes fail."""

    def app(msg: Message, context: Any) -> Message:
        served = sources_by_node.get(context.node_id)
        if served is None:
            reason = "Traceback ...\nConfigError: source 'x': no data"
            return Message(Error(code=2, reason=reason), reply_to=msg)
        return Message(RecordDict({keys.INFO: ConfigRecord({keys.SOURCES: served})}), reply_to=msg)

    return app


def with_venv_on_path(**extra: str) -> dict[str, str]:
    """This process's environment, and ``extra``, with this interpreter's folder first on
    PATH: a script a test runs finds this venv's dept, flwr and flower-* even when the venv
    was never activated."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, **extra, "PATH": path}


def start_shell(
    script: str, cwd: Path, env: Mapping[str, str], output: IO[str] | None = None
) -> subprocess.Popen[str]:
    """``script`` run by bash as a terminal runs it: in a process group of its own (Ctrl-C
    is the group's SIGINT), its output and errors merged into one text stream (a pipe, or
    ``output``)."""
    return subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        stdout=output or subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def fenced_block(doc: Path, heading: str, language: str = "bash") -> str:
    """The first ```language block under ``heading`` in ``doc`` (a Markdown file), as
    printed: what a test runs to hold the docs' examples true."""
    text = doc.read_text()
    section = text[text.index(f"\n{heading}\n") :]
    found = re.search(rf"^```{language}\n(.*?)^```$", section, re.S | re.M)
    assert found, f"{doc}: no {language} block under {heading!r}"
    return found.group(1)


def corpus(name: str) -> Path:
    """A source folder of ../shared/corpora, or skip the test with the reason."""
    path = CORPORA / name
    if not (path / "train.txt").is_file():
        pytest.skip(f"shared corpus {path} is not present on this machine")
    return path


HOLD = "import sys, time; from pathlib import Path; from dept.state.lock import exclusive_folder\n"
HOLD += "with exclusive_folder(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n"


@contextlib.contextmanager
def held_elsewhere(folder: Path) -> Iterator[int]:
    """``folder`` held (:mod:`dept.state.lock`) by another living process, whose pid is yielded;
    that process is killed when the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "64m") -> Iterator[Path]:
    """``folder`` as a fresh tmpfs of ``size``, so a test can fill a real disk
    (:func:`benchmarks.soak.faults.fill`); the test is skipped, saying why, where this
    process may not mount one (it needs root)."""
    from benchmarks.soak import faults

    why = faults.small_disk(folder, size)
    if why:
        pytest.skip(f"a full disk needs a tmpfs, and mount failed: {why}")
    try:
        yield folder
    finally:
        faults.unmount(folder)


# A network namespace's loopback is down when it is made: up, by the SIOCGIFFLAGS and
# SIOCSIFFLAGS ioctls (no `ip` command needed).
LOOPBACK_UP = (
    "import fcntl, socket, struct; s = socket.socket(); "
    "flags = struct.unpack('16sH', fcntl.ioctl(s, 0x8913, struct.pack('16sH', b'lo', 0)))[1]; "
    "fcntl.ioctl(s, 0x8914, struct.pack('16sH', b'lo', flags | 1))"
)
# Commands that listen on fixed ports (Flower's 39091, TensorBoard's 6006) run as printed in
# a network namespace of their own: on a shared machine those ports may be anyone's.
needs_own_network = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root's unshare: a network namespace of its own for a fixed port",
)


def in_own_network(*lines: str) -> list[str]:
    """The command running the shell ``lines`` (``bash -eu``) in a network namespace of
    their own, its loopback up (:data:`needs_own_network`)."""
    script = "\n".join([f'"{sys.executable}" -c "{LOOPBACK_UP}"', *lines])
    return ["unshare", "--net", "--fork", "bash", "-euc", script]
