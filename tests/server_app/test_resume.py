"""Kill a run mid-round, resume it, and get exactly the uninterrupted run's numbers."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from flwr.app import Message, MessageType
from safetensors.torch import load_file

from client_app.app import app as client_app
from dept.config import ConfigError
from dept.wire import keys
from server_app.checkpoint import CheckpointError, load_latest
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.conftest import ProjectLog
from tests.helpers import assert_same_training, debug_run_config, synthetic_sources


class ServerCrash(RuntimeError):
    pass


class CrashingGrid(LocalGrid):
    """Dies like a killed ServerApp once the clients have trained ``crash_round``."""

    def __init__(self, *args, crash_round: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.crash_round = crash_round

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ids = super().push_messages(messages)  # the clients train here, in process
        for msg in messages:
            if msg.metadata.message_type == MessageType.TRAIN:
                config = msg.content.config_records[keys.CONFIG]
                if config[keys.SERVER_ROUND] == self.crash_round:
                    raise ServerCrash(f"killed in round {self.crash_round}")
        return ids


def _config(tmp_path: Path, name: str, cache: Path, **overrides) -> dict:
    sources = synthetic_sources(tmp_path, "latin", "greek", "cyrillic")
    config = debug_run_config(
        tmp_path,
        cache,
        **{
            "sources-file": str(sources),
            "num-server-rounds": 3,
            "local-steps": 4,
            "fraction-train": 0.5,  # sampling is part of what must resume exactly
            "output-dir": str(tmp_path / name),
            **overrides,
        },
    )
    return config


NODES = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
RUN_PARTS = ("run", "state/runs")  # what a run writes: its output, and each source's state


@pytest.fixture(scope="module")
def _finished_once(tmp_path_factory: pytest.TempPathFactory, node_cache: Path) -> tuple[Path, dict]:
    """A finished 2-round run, trained once for the module, and a snapshot of it."""
    base = tmp_path_factory.mktemp("finished")
    config = _config(base, "run", node_cache, **{"num-server-rounds": 2})
    run_federation(LocalGrid(client_app, NODES, config), config)
    for part in RUN_PARTS:
        shutil.copytree(base / part, base / "snapshot" / part, symlinks=True)
    return base, config


@pytest.fixture
def finished_run(_finished_once: tuple[Path, dict]) -> tuple[Path, dict]:
    """The folder and config of a finished 2-round run, its output and node states as the run
    left them: each test damages or resumes its own fresh copy, in place (a resumed run must
    have the same output-dir and state-dir)."""
    base, config = _finished_once
    for part in RUN_PARTS:
        shutil.rmtree(base / part)
        shutil.copytree(base / "snapshot" / part, base / part, symlinks=True)
    return base, config


def _final(out: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    summary = json.loads((out / "summary.json").read_text())
    per_source = {n: s["val_bpb"] for n, s in summary["sources"].items()}
    return per_source, load_file(str(out / "body.safetensors"))


@pytest.mark.parametrize(
    ("variant", "outer", "corrupt_latest", "model", "device", "rows"),
    [
        ("spec-opt", "nesterov", False, "debug", "cpu", "all"),
        ("spec-opt", "nesterov", True, "debug", "cpu", "all"),
        ("trim", "fedadam", False, "debug", "cpu", "all"),  # V_k, row-wise φ, Adam's state
        # the seen rows of each round, the int8 residual of the rows not sent
        ("glob", "nesterov", False, "debug", "cpu", "seen"),
        # each source's ψ_k from its state; the shared ψ from the checkpoint (slow: GPT-2)
        pytest.param(
            "spec-opt", "fedavg", False, "gpt2:debug", "cpu", "all", marks=pytest.mark.slow
        ),
        pytest.param("glob", "fedavg", False, "gpt2:debug", "cpu", "all", marks=pytest.mark.slow),
        pytest.param("trim", "nesterov", False, "debug", "cuda", "seen", marks=pytest.mark.gpu),
    ],
)
def test_a_killed_run_resumes_to_the_uninterrupted_result(
    tmp_path: Path,
    variant: str,
    outer: str,
    corrupt_latest: bool,
    model: str,
    device: str,
    rows: str,
    project_log: ProjectLog,
    node_cache: Path,
) -> None:
    """The same numbers: bit for bit on the CPU, whose kernels are deterministic; within
    :data:`tests.helpers.CUDA_TOLERANCE` on CUDA, whose kernels are not."""
    settings = {
        "device": device,
        "model": model,
        "variant": variant,
        "outer-optimizer": outer,
        "outer-lr": {"fedavg": 1.0, "nesterov": 0.7, "fedadam": 0.01}[outer],
        "global-vocab-size": 600,
        "embedding-rows": rows,
        **({"compression": "int8"} if rows == "seen" else {}),
    }
    # Prepare: the reference, uninterrupted
    reference = _config(tmp_path, "reference", node_cache, **settings)
    expected_bpb, expected_body = _final(
        run_federation(LocalGrid(client_app, NODES, reference), reference).out_dir
    )
    # Execute: killed after the clients trained round 3, before its checkpoint
    interrupted = _config(tmp_path, "interrupted", node_cache, **settings)
    with pytest.raises(ServerCrash):
        run_federation(CrashingGrid(client_app, NODES, interrupted, crash_round=3), interrupted)
    out = tmp_path / "interrupted"
    if corrupt_latest:  # a crash while the checkpoint was written: round 1's is used instead
        tensors = out / "checkpoints" / "round-0002" / "tensors.safetensors"
        tensors.write_bytes(tensors.read_bytes()[:100])
    resumed = {**interrupted, "resume": True}
    run_federation(LocalGrid(client_app, NODES, resumed), resumed)
    # Assert
    got_bpb, got_body = _final(out)
    assert_same_training(got_bpb, expected_bpb, device)
    if variant in ("trim", "glob"):
        want = load_file(str(tmp_path / "reference" / "embeddings.safetensors"))
        got = load_file(str(out / "embeddings.safetensors"))
        assert_same_training(got, want, device)
    assert_same_training(got_body, expected_body, device)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [0, 1, 2, 3]
    if corrupt_latest:
        assert "round-0002 is unusable" in project_log.text


def test_resume_refuses_a_changed_run_or_a_missing_checkpoint(
    tmp_path: Path, node_cache: Path, finished_run: tuple[Path, dict]
) -> None:
    fresh = _config(tmp_path, "run", node_cache)
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        run_federation(LocalGrid(client_app, NODES, fresh), {**fresh, "resume": True})
    _, config = finished_run
    changed = {**config, "resume": True, "lr": 0.01}
    with pytest.raises(ConfigError, match="lr differ"):
        run_federation(LocalGrid(client_app, NODES, changed), changed)
    other_model = {**config, "resume": True, "model": "gpt2:debug"}
    with pytest.raises(ConfigError, match="model differ"):
        run_federation(LocalGrid(client_app, NODES, other_model), other_model)
    renamed = {**config, "resume": True, "model": "llama:debug"}  # "debug" by its full name
    assert run_federation(LocalGrid(client_app, NODES, renamed), renamed).summary["rounds"] == 2


def test_every_checkpoint_unusable_is_a_clear_error(finished_run: tuple[Path, dict]) -> None:
    base, _ = finished_run
    states = list((base / "run" / "checkpoints").glob("round-*/state.json"))
    assert len(states) == 3  # rounds 0, 1 and 2
    for state in states:
        state.write_text("{not json")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        load_latest(base / "run")


def _rewrite_state(folder: Path, edit) -> None:
    """Edit a checkpoint's state.json (its digest then no longer matches)."""
    state_file = folder / "state.json"
    state = json.loads(state_file.read_text())
    edit(state)
    state_file.write_text(json.dumps(state))


def _resign(folder: Path) -> None:
    """Make SHA256SUMS match the files again: a checkpoint whole but wrong inside."""
    sums = "".join(
        f"{hashlib.sha256((folder / name).read_bytes()).hexdigest()}  {name}\n"
        for name in ("state.json", "tensors.safetensors")
    )
    (folder / "SHA256SUMS").write_text(sums)


@pytest.mark.parametrize(
    ("damage", "logged"),
    [
        ("edited round", "state.json does not match its SHA-256"),
        ("no strategy field", "state.json lacks strategy"),
        ("round of another folder", "state.json says round 1, its folder round-0002"),
        ("strategy state incomplete", "unusable (KeyError('history')"),
    ],
)
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(
    finished_run: tuple[Path, dict],
    damage: str,
    logged: str,
    project_log: ProjectLog,
) -> None:
    # Prepare: a finished 2-round run, then its newest checkpoint damaged
    base, config = finished_run
    newest = base / "run" / "checkpoints" / "round-0002"
    if damage == "edited round":
        _rewrite_state(newest, lambda s: s.update(round=1))
    elif damage == "no strategy field":
        _rewrite_state(newest, lambda s: s.pop("strategy"))
        _resign(newest)
    elif damage == "round of another folder":
        _rewrite_state(newest, lambda s: s.update(round=1))
        _resign(newest)
    else:
        _rewrite_state(newest, lambda s: s["strategy"].pop("history"))
        _resign(newest)
    # Execute
    resumed = {**config, "resume": True}
    run_federation(LocalGrid(client_app, NODES, resumed), resumed)
    # Assert: round 2 re-run from round 1's checkpoint, with a log line naming the damage
    text = project_log.text
    assert f"{newest} is unusable" in text and logged in text, text
    assert "resuming run" in text and "after round 1" in text
    lines = (base / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [0, 1, 2]
