"""The fault soak: its parts on plain files and fake rounds (fast), and a short soak of at
least ten faults through the real loopback deployment (``slow``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.soak import checks as soak_checks
from benchmarks.soak import fault_soak
from benchmarks.soak import faults as inject
from benchmarks.soak import reference as soak_reference
from benchmarks.soak import report as soak_report
from benchmarks.soak.watch import Fault, Rounds
from client_app.warm import file_lock
from tests.command_examples import ROOT, all_examples
from tests.helpers import with_venv_on_path

NOW = 1000.0


def _line(server_round: int, wall_s: float, trained: tuple[str, ...]) -> str:
    sources = {s: {"tokens": 10} for s in trained} | {"idle": {"tokens": 0}}
    return json.dumps({"round": server_round, "wall_s": wall_s, "sources": sources})


def _rounds(tmp_path: Path, *lines: str) -> Rounds:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(f"{line}\n" for line in lines))
    rounds = Rounds(metrics)
    rounds.poll()
    return rounds


def test_a_node_fault_recovers_in_the_first_later_round_its_source_trains(tmp_path: Path) -> None:
    # Prepare: round 2 was done at the fault; round 3 went on without the source
    rounds = _rounds(tmp_path, _line(1, 1.0, ("a", "b")), _line(2, 2.0, ("a", "b")))
    fault = Fault(inject.WORKER, "a", at=time.monotonic(), done_before=rounds.done)
    metrics = rounds.metrics
    metrics.write_text(metrics.read_text() + _line(3, 3.0, ("b",)) + "\n")

    # Execute
    rounds.poll()
    pending = rounds.settle(fault)
    metrics.write_text(metrics.read_text() + _line(4, 4.0, ("a", "b")) + "\n")
    rounds.poll()

    # Assert
    assert not pending
    assert rounds.settle(fault)
    assert fault.rounds_lost == 1
    assert fault.recovered_at is not None and fault.recovered_at >= fault.at


def test_a_server_fault_recovers_with_the_resumed_servers_first_round(tmp_path: Path) -> None:
    rounds = _rounds(tmp_path, _line(0, 0.5, ()), _line(1, 1.0, ("a",)), _line(2, 2.0, ("a",)))
    fault = Fault(inject.SERVER, "server", at=time.monotonic(), done_before=2)
    # The resumed server rewrites the lines of its checkpoint (seen already), then re-runs 2.
    rounds.metrics.write_text(_line(0, 0.5, ()) + "\n" + _line(1, 1.0, ("a",)) + "\n")
    rounds.poll()
    assert not rounds.settle(fault), "no resume noted, nothing new"
    fault.resumed_after = 1
    assert not rounds.settle(fault), "rewritten lines are not a new round"

    rounds.metrics.write_text(rounds.metrics.read_text() + _line(2, 2.7, ("a",)) + "\n")
    rounds.poll()

    assert rounds.settle(fault)
    assert fault.rounds_lost == 1, "round 2 was done, then done again"


def test_corrupt_changes_bytes_but_keeps_size_and_a_readable_header(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "embeddings.safetensors"
    save_file({"w": torch.zeros(64, 8)}, str(path))
    before = path.read_bytes()

    inject.corrupt(path, seed=3)

    after = path.read_bytes()
    assert len(after) == len(before)
    assert sum(a != b for a, b in zip(before, after, strict=True)) == inject.CORRUPT_BYTES
    assert load_file(str(path))["w"].abs().sum() > 0, "it loads, with wrong values"


def test_newest_round_dir_ignores_other_names(tmp_path: Path) -> None:
    for name in ("round-0002", "round-0010", ".tmp-round-0011", "round-0003.bak"):
        (tmp_path / "runs" / "x" / name).mkdir(parents=True)
    assert inject.newest_round_dir(tmp_path) == tmp_path / "runs" / "x" / "round-0010"
    assert inject.newest_round_dir(tmp_path / "none") is None


def test_find_sees_only_the_group_it_is_given(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        assert [p.pid for p in inject.in_group(child.pid)] == [child.pid]
        assert inject.find(child.pid, Path(sys.executable).name)
        assert not inject.find(child.pid, "flwr-clientapp")
        assert not list(inject.in_group(os.getpgrp())) or child.pid not in {
            p.pid for p in inject.in_group(os.getpgrp())
        }
    finally:
        inject.kill([child.pid])
        child.wait()
    assert not list(inject.in_group(child.pid))


def _state_problem(source: str, server_round: int) -> dict:
    event = "embeddings from the state of round 1 in round 3, not round 2's (...)"
    return {"kind": "state", "round": server_round, "source": source, "event": event}


def test_state_events_need_a_corruption_of_that_source_before_them() -> None:
    summary = {"problems": [_state_problem("a", 3), {"kind": "failed", "round": 2}]}
    caused = Fault(inject.CLIENT_STATE, "a", at=NOW, done_before=2)
    elsewhere = Fault(inject.CLIENT_STATE, "b", at=NOW, done_before=2)
    later = Fault(inject.CLIENT_STATE, "a", at=NOW, done_before=3)

    assert soak_checks.unexplained_state_events(summary, [caused]) == []
    assert len(soak_checks.unexplained_state_events(summary, [elsewhere, later])) == 1
    assert len(soak_checks.unexplained_state_events(summary, [])) == 1


def test_leftovers_finds_sockets_temporaries_held_and_named_locks(tmp_path: Path) -> None:
    (tmp_path / "state" / ".tmp-round-0003").mkdir(parents=True)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "flwr-xyz").write_text("")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".dept-run.lock").write_text('{"pid": 1}')
    (tmp_path / "free.lock").write_text("")
    with socket.socket(socket.AF_UNIX) as sock, file_lock(tmp_path / "worker.lock"):
        sock.bind(str(tmp_path / "worker.sock"))
        found = "\n".join(soak_checks.leftovers(tmp_path, []))
    assert "socket" in found and "worker.sock" in found
    assert "held lock" in found and "worker.lock" in found
    assert ".tmp-round-0003" in found and "flwr-xyz" in found
    assert "names a holder" in found
    assert "free.lock" not in found


def test_leftovers_finds_a_living_process_of_a_group(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path)],
        start_new_session=True,
    )
    try:
        found = soak_checks.leftovers(tmp_path, [child.pid])
    finally:
        inject.kill([child.pid])
        child.wait()
    assert any(str(child.pid) in f for f in found), found
    assert soak_checks.leftovers(tmp_path, [child.pid]) == []


def test_the_table_counts_recoveries_and_lost_rounds() -> None:
    rows = [
        {"kind": "worker-kill", "recovery_s": 4.0, "rounds_lost": 0},
        {"kind": "worker-kill", "recovery_s": 10.0, "rounds_lost": 1},
        {"kind": "partition", "recovery_s": None, "rounds_lost": 2},
    ]
    table = soak_report.by_kind(rows)
    assert table["worker-kill"] == {
        "faults": 2,
        "recovered": 2,
        "median_recovery_s": 7.0,
        "max_recovery_s": 10.0,
        "rounds_lost": 1,
    }
    assert table["partition"]["recovered"] == 0 and table["partition"]["max_recovery_s"] is None


def test_many_soaks_show_each_one_and_their_faults_pooled_by_kind() -> None:
    def soak(seed: int, gap: float, broken: list[str]) -> dict:
        faults = [{"kind": "worker-kill", "recovery_s": 5.0 + seed, "rounds_lost": seed}]
        final = {"avg_val_bpb": 2.0, "twin_avg_val_bpb": 2.0 - gap, "relative_bpb_gap": gap}
        return {
            "options": {"seed": seed},
            "faults": faults,
            "by_kind": soak_report.by_kind(faults),
            "final": {**final, "body_relative_l2": 0.0},
            "wall_s": 100.0,
            "checks": {"result": broken, "leftovers": []},
        }

    text = soak_report.many([soak(1, 0.0, []), soak(2, 0.01, ["bits per byte differ"])])

    rows = [
        line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")
    ]
    assert rows[0].endswith("| hold |") and "+1.0000%" in rows[1] and "FAILED: result" in rows[1]
    assert "1 of 2 soaks pass every check." in text
    assert "| worker-kill | 2 | 2 | 6.5 | 7.0 | 3 |" in text


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the soak's own limit (timeout_s) comes first, then its checks
def test_a_short_soak_of_ten_faults_loses_nothing(tmp_path: Path) -> None:
    # the loopback SuperNodes: the same faults, each found in a third of Flower's heartbeat
    # window, and the SuperLink's state in memory (the hundred-fault soak, run by hand,
    # keeps Flower's heartbeats and the deployment's database file)
    work = tmp_path / "soak"
    opts = fault_soak.Options(
        work,
        rounds=8,
        faults=10,
        seed=1,
        timeout_s=1200,
        loopback_supernodes=True,
        superlink_in_memory=True,
    )
    started = time.monotonic()

    result = fault_soak.run_soak(opts)

    print(soak_report.render(result), f"\n{time.monotonic() - started:.0f} s in all")
    assert len(result["faults"]) >= 10
    assert set(result["by_kind"]) == set(result["kinds"]), "every kind was injected"
    assert set(result["kinds"]) == set(inject.KINDS) or "disks" in result, "or it says why not"
    assert not any(result["checks"].values()), result["checks"]


def test_a_run_that_ends_before_every_fault_is_in_fails_the_soak_and_says_what_to_give() -> None:
    opts = fault_soak.Options(Path("w"), rounds=60, faults=100)

    assert fault_soak.too_few_faults(100, opts) == []
    assert fault_soak.too_few_faults(48, opts) == [
        "48 of 100 faults injected before the run's 60 rounds were done: give it more --rounds"
    ]


LONG_SOAK = "python -m benchmarks.soak.fault_soak --work /tmp/soak --rounds 60 --faults 100"
LONG_SOAK_VARIABLE = "DEPT_LONG_SOAK"


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get(LONG_SOAK_VARIABLE),
    reason=f"the hundred-fault soak takes an hour alone on 2 cores: {LONG_SOAK_VARIABLE}=1 runs it",
)
@pytest.mark.timeout(int(fault_soak.TIMEOUT_S_PER_FAULT * 100 + 900))  # its own limit first
def test_the_long_soak_as_printed_loses_nothing(tmp_path: Path) -> None:
    assert LONG_SOAK in all_examples(), "the docs' long soak is this one"
    work, out = tmp_path / "soak", tmp_path / "out"  # the shared /tmp/soak and the results'
    command = f"{LONG_SOAK.replace('/tmp/soak', str(work))} --out {out}"

    subprocess.run(command, shell=True, cwd=ROOT, env=with_venv_on_path(), check=True)

    result = json.loads((out / "fault_soak.json").read_text())
    assert len(result["faults"]) >= 100 and result["options"]["rounds"] == 60
    assert set(result["by_kind"]) == set(result["kinds"]), "every kind was injected"
    assert not any(result["checks"].values()), result["checks"]


def _finished_run(
    folder: Path,
    final: dict[str, float],
    paired_average: float,
    rounds: list[dict[str, dict[str, float]]] | None = None,
) -> Path:
    """A run folder as the soak reads it: summary.json, metrics.jsonl (``rounds``: each
    round's sources, with tokens where it trained; by default one round, all trained) and
    the last round's tensors."""
    sources = {name: {"val_bpb": value} for name, value in final.items()}
    summary = {"sources": sources, "avg_val_bpb": paired_average}
    (folder / "summary.json").parent.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    lines = rounds or [{s: {"tokens": 1, "val_bpb": v} for s, v in final.items()}]
    metrics = [json.dumps({"round": r + 1, "sources": line}) for r, line in enumerate(lines)]
    (folder / "metrics.jsonl").write_text("\n".join(metrics) + "\n")
    round_dir = folder / "checkpoints" / "round-0003"
    round_dir.mkdir(parents=True)
    save_file({"w": torch.ones(3)}, str(round_dir / "tensors.safetensors"))
    return folder


def test_the_soak_compares_the_same_sources_final_figures_as_its_twin(
    tmp_path: Path,
) -> None:
    # Prepare: equal final figures; the soak's summary average left out a source whose
    # round-0 evaluation a fault took (it averages only sources measured before and after)
    final = {"a": 2.0, "b": 1.0, "c": 3.0}
    soak = _finished_run(tmp_path / "soak", final, paired_average=1.5)
    twin = _finished_run(tmp_path / "twin", final, paired_average=2.0)
    # Execute
    figures, broken = soak_checks.compare(soak, twin)
    # Assert
    assert broken == []
    assert figures["relative_bpb_gap"] == 0.0
    assert figures["avg_val_bpb"] == figures["twin_avg_val_bpb"] == 2.0


def test_any_difference_from_the_twin_breaks_the_check_and_the_spread_is_recorded(
    tmp_path: Path,
) -> None:
    twin = _finished_run(tmp_path / "twin", {"a": 2.0, "b": 1.6}, 1.8)
    soak = _finished_run(tmp_path / "soak", {"a": 2.0001, "b": 1.6}, 1.8)
    figures, broken = soak_checks.compare(soak, twin)
    assert figures["relative_bpb_gap"] == pytest.approx(0.0001 / 3.6)
    assert len(broken) == 1 and "bits per byte differ from the twin's" in broken[0]
    references = [
        _finished_run(tmp_path / f"seed{n}", {"a": a, "b": 1.6}, 1.8)
        for n, a in enumerate((2.0, 2.05, 1.98))
    ]
    assert soak_checks.spread(references) == pytest.approx(0.035 / ((1.8 + 1.825 + 1.79) / 3))


def test_the_twin_is_absent_where_the_soak_took_nothing_from_a_source(tmp_path: Path) -> None:
    # Prepare: "a" was cut off after its first round; a resumed server rewrote round 2,
    # whose first line (a lineage the resume dropped) counts for nothing
    lines = [
        (1, {"a": {"tokens": 1}, "b": {"tokens": 1}}),
        (2, {"a": {"tokens": 1}, "b": {"tokens": 1}}),
        (2, {"a": {"tokens": 0}, "b": {"tokens": 1}}),
        (3, {"b": {"tokens": 1}}),
    ]
    run = tmp_path / "run"
    run.mkdir()
    text = "".join(json.dumps({"round": r, "sources": s}) + "\n" for r, s in lines)
    (run / "metrics.jsonl").write_text(json.dumps({"round": 0, "sources": {}}) + "\n" + text)
    # Execute, Assert
    assert soak_reference.absences(run, ("a", "b")) == {1: [], 2: ["a"], 3: ["a"]}
    assert soak_reference.fallbacks(run) == {}
    assert soak_checks.trained_rounds(run) == {"a": 1, "b": 3}


def test_the_twin_falls_back_where_a_node_said_it_did(tmp_path: Path) -> None:
    events = {
        3: [{"source": "a", "event": "embeddings from the state of round 1 in round 3, not "
             "round 2's (round 2: SafetensorError: ...)"}],
        4: [{"source": "b", "event": "fresh embeddings in round 4: state lost (no saved state)"},
            {"source": "a", "event": "embeddings from the state of round 1 in round 3, not "
             "round 2's (an evaluation reports it too)"}],
    }  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"round": r, "sources": {}, "state_events": events.get(r, [])} for r in range(5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert soak_reference.fallbacks(run) == {3: {"a": 1}, 4: {"b": -1}}
    state = tmp_path / "state" / "a"
    for n in (1, 2, 3):
        (state / "runs" / "r1" / "a" / f"round-{n:04d}").mkdir(parents=True)
    soak_reference.forget_states_after(state, 1)
    assert [p.name for p in (state / "runs" / "r1" / "a").iterdir()] == ["round-0001"]
