"""What must hold after a fault soak, each check a list of what broke it (empty: it holds).

- every fresh start or older-state fallback of a source is one a fault caused;
- the result equals its participation twin's, bit for bit (the same rounds of each source,
  from the same states, trained without faults): what a fault costs beyond what the soak
  recorded of it (a state lost silently, data skipped or replayed) shows as a difference;
- nothing is left: no process of the soak's process groups or naming its folder, no socket,
  no held lock, no temporary folder, no run lock naming a holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from benchmarks.soak import faults
from benchmarks.soak.watch import Fault
from dept.state.jsonl import read_lines
from dept.state.lock import LOCK_FILE
from server_app.checkpoint import CHECKPOINTS, TENSORS_FILE

TEMPORARY = (".tmp-", ".spool", ".mode-probe-")


# Faults that can cost a source its newest state: a corrupted file, a worker killed while it
# wrote the state behind a reply (dept.state.write_behind), a full disk under that write.
STATE_LOSING = (faults.CLIENT_STATE, faults.WORKER, faults.STATE_FULL)


def unexplained_state_events(summary: dict[str, Any], injected: list[Fault]) -> list[str]:
    """State events (fresh starts, older-state fallbacks) with no fault that can lose that
    source's state injected before that round."""
    corrupted: dict[str, list[int]] = {}
    for fault in injected:
        if fault.kind in STATE_LOSING:
            corrupted.setdefault(fault.target, []).append(fault.done_before)
    found = []
    for problem in summary["problems"]:
        if problem["kind"] != "state":
            continue
        source, at = problem.get("source", ""), int(problem["round"])
        if not any(before < at for before in corrupted.get(source, [])):
            found.append(f"round {at} {source}: {problem.get('event')}")
    return found


def spread(references: list[Path]) -> float:
    """The spread of fault-free runs' average final bits per byte: (max − min) / mean."""
    averages = [average(final_bpb(r).values()) for r in references]
    return (max(averages) - min(averages)) / average(averages)


def compare(run: Path, twin: Path) -> tuple[dict[str, Any], list[str]]:
    """The soak's final numbers against its participation twin's (the same run trained
    fault-free in exactly the rounds the soak took of each source, from the states its nodes
    fell back to), and what is off: any difference at all. The twin replays everything the
    soak recorded of its faults, so what remains is a cost no record explains (a state lost
    silently, data skipped or replayed): the losses that matter here move the final figure by
    hundredths of a percent, far inside any tolerance a seed spread would give."""
    per_source, twin_per_source = final_bpb(run), final_bpb(twin)
    shared_sources = sorted(per_source.keys() & twin_per_source.keys())
    mean = average(per_source[s] for s in shared_sources)
    twin_mean = average(twin_per_source[s] for s in shared_sources)
    body, body_twin = _final_tensors(run), _final_tensors(twin)
    shared = sorted(body.keys() & body_twin.keys())
    diff = math.sqrt(sum(float((body[k] - body_twin[k]).double().pow(2).sum()) for k in shared))
    norm = math.sqrt(sum(float(body_twin[k].double().pow(2).sum()) for k in shared))
    figures = {
        "avg_val_bpb": mean,
        "twin_avg_val_bpb": twin_mean,
        "relative_bpb_gap": mean / twin_mean - 1,
        "val_bpb": per_source,
        "twin_val_bpb": twin_per_source,
        "rounds_trained": trained_rounds(run),
        "body_relative_l2": diff / norm if norm else 0.0,
    }
    broken = []
    if body.keys() != body_twin.keys():
        broken.append(f"final tensors differ in keys: {sorted(body.keys() ^ body_twin.keys())}")
    unequal = [k for k in shared if not torch.equal(body[k], body_twin[k])]
    if unequal:
        broken.append(
            f"the final body differs from its twin's (relative L2 {diff / norm:.2e}) in "
            f"{len(unequal)} tensor(s), e.g. {unequal[:3]}"
        )
    if per_source != twin_per_source:
        broken.append(
            f"bits per byte differ from the twin's ({mean / twin_mean - 1:+.4%} on average): "
            f"{per_source} vs {twin_per_source}"
        )
    return figures, broken


def final_bpb(out: Path) -> dict[str, float]:
    """Each source's final bits per byte in a run's ``summary.json``."""
    return {s: float(m["val_bpb"]) for s, m in sorted(_summary(out)["sources"].items())}


def _rounds(out: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl``'s rounds, the last line of each (a resumed server rewrites those
    after the checkpoint it resumed from), in round order."""
    last = {int(line["round"]): line for line in read_lines(out / "metrics.jsonl")}
    return [last[r] for r in sorted(last)]


def trained_rounds(out: Path) -> dict[str, int]:
    """Per source, the rounds whose update from it the run took."""
    counts: dict[str, int] = {}
    for line in _rounds(out):
        for source, metrics in line["sources"].items():
            counts[source] = counts.get(source, 0) + bool(metrics.get("tokens"))
    return counts


def average(values: Iterable[float]) -> float:
    listed = list(values)
    return sum(listed) / len(listed)


def _summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


def _final_tensors(out: Path) -> dict[str, torch.Tensor]:
    newest = faults.newest_round_dir(out / CHECKPOINTS)
    assert newest is not None, f"{out} has no checkpoint"
    return load_file(str(newest / TENSORS_FILE))


def leftovers(root: Path, groups: Iterable[int]) -> list[str]:
    """What the soak left behind under ``root`` or running: processes in its groups or
    naming ``root``, sockets, held locks, temporary files, a run lock naming a holder."""
    found = [f"process {p.pid} {' '.join(p.argv[:3])}" for g in groups for p in faults.in_group(g)]
    found += [f"process {pid} names {root}" for pid in _naming(str(root))]
    for path in root.rglob("*"):
        if path.is_socket():
            found.append(f"socket {path}")
        elif path.name.startswith(TEMPORARY):
            found.append(f"temporary {path}")
        elif path.suffix == ".lock" and path.is_file() and _held(path):
            found.append(f"held lock {path}")
        if path.name == LOCK_FILE and path.read_text().strip() not in ("", "{}"):
            found.append(f"run lock {path} names a holder: {path.read_text().strip()}")
    tmp = root / "tmp"
    if tmp.is_dir():
        found += [f"temporary {p}" for p in tmp.iterdir()]
    return sorted(set(found))


def _naming(text: str) -> list[int]:
    """Processes whose command line holds ``text``, but for this one and its ancestors
    (the soak itself, whatever started it with ``--work``)."""
    mine, pid = set(), os.getpid()
    while pid > 1:
        mine.add(pid)
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in mine:
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids


def _held(path: Path) -> bool:
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False
