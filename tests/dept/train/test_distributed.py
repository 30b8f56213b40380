"""A source trained on several processes: the same update as one process, and clean failures."""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from client_app.node import served_sources
from dept.config import ConfigError, load_config
from dept.data.sources import SourceSpec, check_nproc, load_sources
from dept.model.build import build_model
from dept.model.roles import body_state
from dept.state.workspace import Workspace
from dept.train import distributed
from dept.train.budget import Device, check_client_fits
from dept.train.distributed import RankFailed, failure_cause
from dept.train.local import RoundResult
from dept.train.source_client import SourceClient
from tests.helpers import debug_run_config, share_cache

# The pseudo-gradient of 2 CPU processes against 1 at the same global batch (debug model, 8
# steps). Measured: max abs difference 3.6e-7 (DDP and FSDP) where the largest |Δ| is 2.0e-2,
# and a relative L2 difference ‖Δ₂ − Δ₁‖ / ‖Δ₁‖ of 8e-7: float32 summation order, nothing more.
MAX_ABS, MAX_RELATIVE = 1e-5, 1e-5
BODY = body_state(build_model("debug", 300, 64, seed=0))


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path: Path, node_cache: Path) -> None:
    share_cache(tmp_path / "state", node_cache)


@pytest.fixture
def no_process_left() -> Iterator[None]:
    """After the test, this process has no child left that the test started (every rank
    ended). Children it had before stay, and so does multiprocessing's resource tracker,
    which lives as long as this process by design, whichever test first needed it."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    time.sleep(0.5)  # a rank killed at the very end has gone, but not yet been reaped
    now = psutil.Process().children(recursive=True)
    left = [p.cmdline() for p in now if p.pid not in before and not _resource_tracker(p)]
    assert not left, f"processes left behind: {left}"


def _resource_tracker(process: psutil.Process) -> bool:
    return any("multiprocessing.resource_tracker" in part for part in process.cmdline())


def _client(tmp_path: Path, nproc: int, run: str, **overrides: object) -> SourceClient:
    cfg = load_config(debug_run_config(tmp_path, **overrides))  # type: ignore[arg-type]
    spec = next(s for s in load_sources(None) if s.name == "synth-greek")
    spec = dataclasses.replace(spec, nproc=nproc)
    return SourceClient(cfg, spec, Workspace(tmp_path / "state", run, spec.name), [spec])


def _difference(one: RoundResult, two: RoundResult) -> tuple[float, float]:
    """(max abs, relative L2) difference of two rounds' pseudo-gradients."""
    assert one.delta.keys() == two.delta.keys()
    gaps = {k: two.delta[k] - one.delta[k] for k in one.delta}
    largest = max(float(g.abs().max()) for g in gaps.values())
    norm = torch.sqrt(sum(((g.double() ** 2).sum() for g in gaps.values()), torch.tensor(0.0)))
    base = torch.sqrt(sum(((d.double() ** 2).sum() for d in one.delta.values()), torch.tensor(0.0)))
    return largest, float(norm / base)


def _same_stats(one: RoundResult, two: RoundResult) -> None:
    assert two.stats.tokens == one.stats.tokens and two.stats.steps == one.stats.steps
    assert two.stats.mean_loss == pytest.approx(one.stats.mean_loss, rel=1e-5)
    assert two.stats.final_loss == pytest.approx(one.stats.final_loss, rel=1e-5)


def test_nproc_must_divide_the_batch_and_be_positive(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path, **{"batch-size": 6}))
    spec = SourceSpec(name="de", path="builtin:synthetic-latin", nproc=4)

    with pytest.raises(
        ConfigError, match=r"source 'de' key 'nproc' \(4\): config key 'batch-size'"
    ):
        check_nproc(cfg, spec)
    check_nproc(cfg, dataclasses.replace(spec, nproc=3))
    with pytest.raises(ConfigError, match="source 'de': 'nproc' must be >= 1"):
        SourceSpec(name="de", path="builtin:synthetic-latin", nproc=0)


def _failure(
    tmp_path: Path, rank: int, exitcode: int, message: str = "", at: int = 0
) -> ProcessFailure:
    """A launcher's record of a failed rank, with the error file ``@record`` writes."""
    error_file = tmp_path / f"error-{rank}.json"
    if message:
        info = {"message": message, "extraInfo": {"py_callstack": "", "timestamp": str(at)}}
        error_file.write_text(json.dumps({"message": info}))
    return ProcessFailure(rank, 1000 + rank, exitcode, str(error_file))


def test_the_cause_is_the_first_rank_to_fail_of_its_own_accord(tmp_path: Path) -> None:
    cut_off = _failure(tmp_path, 0, 1, "DistBackendError: ... timed out", at=5)
    reset = _failure(tmp_path, 5, 1, "RuntimeError: [gloo/...] Connection reset by peer", at=4)
    raised = _failure(tmp_path, 1, 1, "RuntimeError: loss became nan", at=5)
    stopped = _failure(tmp_path, 2, -signal.SIGTERM)
    killed = _failure(tmp_path, 3, -signal.SIGKILL)
    silent = _failure(tmp_path, 4, 3)

    assert failure_cause({0: cut_off, 1: raised, 2: stopped, 5: reset}) == (
        1,
        "RuntimeError: loss became nan",
    )
    rank, why = failure_cause({2: stopped, 3: killed})
    assert rank == 3 and why.startswith("Signal 9 (SIGKILL) received by PID 1003")
    assert failure_cause({4: silent}) == (4, "exited with code 3 before recording an error")


@pytest.mark.slow
def test_two_processes_give_one_process_update_and_resume_exactly(
    tmp_path: Path, no_process_left: None
) -> None:
    one, two = _client(tmp_path, 1, "one"), _client(tmp_path, 2, "two")
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    alone = [one.train_round(BODY, 0, 1), one.train_round(BODY, 8, 2)]
    ranked = [two.train_round(BODY, 0, 1), two.train_round(BODY, 8, 2)]
    rerun = two.train_round(BODY, 8, 2)  # the server resumed after round 1

    for single, parallel in zip(alone, ranked, strict=True):  # round 2 reads round 1's state
        largest, relative = _difference(single, parallel)
        assert largest < MAX_ABS and relative < MAX_RELATIVE, (largest, relative)
        _same_stats(single, parallel)
    assert all(torch.equal(rerun.delta[k], ranked[1].delta[k]) for k in rerun.delta)
    states = [c.ws.load_state(before_round=3).state for c in (one, two)]
    assert states[0] is not None and states[1] is not None
    assert states[1].position == states[0].position, "the ranks walked one stream"
    assert states[1].optimizer["state"].keys() == states[0].optimizer["state"].keys()
    assert not list(two.ws.dir.glob(".ranks-*")), "the round's folder is removed"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


@pytest.mark.slow
def test_fsdp_shards_and_gives_the_same_update(tmp_path: Path, no_process_left: None) -> None:
    one = _client(tmp_path, 1, "one", compression="int8")
    fsdp = _client(tmp_path, 2, "fsdp", compression="int8", **{"data-parallel": "fsdp"})

    alone = [one.train_round(BODY, 0, 1), one.train_round(BODY, 8, 2)]
    sharded = [fsdp.train_round(BODY, 0, 1), fsdp.train_round(BODY, 8, 2)]

    for single, parallel in zip(alone, sharded, strict=True):  # AdamW moments cut and joined
        largest, relative = _difference(single, parallel)
        assert largest < MAX_ABS and relative < MAX_RELATIVE, (largest, relative)
        assert parallel.payload.keys() == single.payload.keys(), "int8 codes and scales"


@pytest.mark.slow
def test_a_rank_that_raises_fails_the_round_naming_source_rank_and_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_process_left: None
) -> None:
    monkeypatch.setattr(distributed, "RANK_MODULE", "tests.dept.failing_rank")
    client = _client(tmp_path, 2, "run")

    with pytest.raises(RankFailed) as failed:
        client.train_round(BODY, 0, 1)

    assert str(failed.value) == (
        "source 'synth-greek': rank 1 of 2 failed: RuntimeError: injected failure at micro-batch 3"
    )
    assert client.ws.load_state(before_round=2).state is None, "no state of a failed round"
    assert not list(client.ws.dir.glob(".ranks-*"))


@pytest.mark.slow
def test_a_killed_rank_fails_the_round_and_leaves_no_process(
    tmp_path: Path, no_process_left: None
) -> None:
    long = {"local-steps": 100_000, "round-timeout-s": 3600.0}  # it never ends by itself
    client = _client(tmp_path, 2, "run", **long)
    killed: list[int] = []
    killer = threading.Thread(target=_kill_rank_1_when_training, args=(client, killed))
    killer.start()

    with pytest.raises(RankFailed, match=r"rank 1 of 2 failed: Signal 9 \(SIGKILL\)") as failed:
        client.train_round(BODY, 0, 1)

    killer.join()
    assert f"received by PID {killed[0]}" in str(failed.value)


def _kill_rank_1_when_training(client: SourceClient, killed: list[int]) -> None:
    """SIGKILL rank 1 once it has spent 4.5 s of CPU: past its imports and set-up (3.3 s
    measured), in a round of 100,000 steps."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not killed:
        for process in psutil.Process().children(recursive=True):
            try:
                if process.environ().get("RANK") == "1" and sum(process.cpu_times()[:2]) > 4.5:
                    process.kill()
                    killed.append(process.pid)
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.2)


def test_fsdp_shares_the_training_state_so_a_larger_body_fits(tmp_path: Path) -> None:
    gpu = Device("cuda", memory=1e9, peak_flops=1e15)  # 1 GB: too small for 125m's 1.4 GB
    cfg = load_config(debug_run_config(tmp_path, model="125m"))
    fsdp = dataclasses.replace(cfg, data_parallel="fsdp")

    check_client_fits(fsdp, 1024, "source 'x' key 'vocab-size'", gpu, nproc=4)
    for config, nproc in ((cfg, 4), (fsdp, 1)):  # DDP holds it all on each device
        with pytest.raises(ConfigError, match=r"a client needs at least 1\.4 GB"):
            check_client_fits(config, 1024, "source 'x' key 'vocab-size'", gpu, nproc=nproc)


def test_a_node_config_gives_its_source_processes(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    node = {"source": "de", "path": "builtin:synthetic-latin", "nproc": 2}

    served, _ = served_sources(cfg, node)

    assert served[0].nproc == 2


@pytest.mark.slow
def test_two_processes_agree_on_the_steps_of_a_time_budgeted_round(
    tmp_path: Path, no_process_left: None
) -> None:
    """Each rank times its own steps; rank 0's decision after each step holds for both, so
    neither waits in a collective the other never joins, and they walk one stream."""
    budget = {"round-time-s": 1.5, "step-delay-s": 0.3, "max-local-steps": 16}
    two = _client(tmp_path, 2, "timed", **budget)  # type: ignore[arg-type]

    result = two.train_round(BODY, 0, 1)

    steps = result.stats.steps
    assert 1 <= steps <= 1.5 / 0.3 and result.stats.tokens == steps * 4 * 64
    state = two.ws.load_state(before_round=2).state
    assert state is not None and (state.position.epoch, state.position.offset) == (0, steps * 4)
