"""What must hold after a fault soak, each check a list of what broke it (empty: it holds).

- every fresh start or older-state fallback of a source is one a fault caused;
- the result equals the fault-free run's where only server faults were injected (exact
  resume), and is within :data:`BPB_TOLERANCE` otherwise of what the fault-free run reached
  after as many rounds of each source's training as the soak gave it;
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
from dept.state.lock import LOCK_FILE
from server_app.checkpoint import CHECKPOINTS, TENSORS_FILE

# Relative gap in average bits per byte allowed when node faults changed what a source trained
# on (a corrupted state sent it back to an older one, a round went on without it). The
# rounds a source lost are not in it: it is compared with the fault-free run after as many
# of its own rounds (a partition past two heartbeats costs a source three rounds of eight:
# +10% against the fault-free run's final figure, once).
BPB_TOLERANCE = 0.05
TEMPORARY = (".tmp-", ".spool", ".mode-probe-")


# Faults that can cost a source its newest state: a corrupted file, or a worker killed while it
# wrote the state behind a reply (dept.state.write_behind).
STATE_LOSING = (faults.CLIENT_STATE, faults.WORKER)


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


def compare(run: Path, reference: Path, exact: bool) -> tuple[dict[str, Any], list[str]]:
    """The soak's final numbers against the fault-free run's, and what is off: with
    ``exact`` any difference, else an average bpb more than :data:`BPB_TOLERANCE` away from
    the fault-free run's after each source's number of trained rounds in the soak."""
    ours, theirs = _summary(run), _summary(reference)
    body, body_ref = _final_tensors(run), _final_tensors(reference)
    # The final figures of the same sources on both sides: summary.json's average covers only
    # the sources measured before training too, and a fault in round 0's evaluation drops a
    # source from the soak's (-13% once, with every source's final figure equal).
    per_source = {s: ours["sources"][s]["val_bpb"] for s in sorted(theirs["sources"])}
    reference_per_source = {s: m["val_bpb"] for s, m in sorted(theirs["sources"].items())}
    trained, reference_rounds = trained_rounds(run), _rounds(reference)
    expected = {
        s: bpb_after_rounds(reference_rounds, s, trained.get(s, 0)) or reference_per_source[s]
        for s in reference_per_source
    }
    mean, reference_mean = _mean(per_source.values()), _mean(reference_per_source.values())
    expected_mean = _mean(expected.values())
    gap = mean / expected_mean - 1
    shared = sorted(body.keys() & body_ref.keys())
    diff = math.sqrt(sum(float((body[k] - body_ref[k]).double().pow(2).sum()) for k in shared))
    norm = math.sqrt(sum(float(body_ref[k].double().pow(2).sum()) for k in shared))
    figures = {
        "avg_val_bpb": mean,
        "reference_avg_val_bpb": reference_mean,
        "expected_avg_val_bpb": expected_mean,
        "relative_bpb_gap": gap,
        "val_bpb": per_source,
        "reference_val_bpb": reference_per_source,
        "expected_val_bpb": expected,
        "rounds_trained": {s: trained.get(s, 0) for s in per_source},
        "body_relative_l2": diff / norm if norm else 0.0,
        "exact_expected": exact,
    }
    broken = []
    if body.keys() != body_ref.keys():
        broken.append(f"final tensors differ in keys: {sorted(body.keys() ^ body_ref.keys())}")
    if exact:
        unequal = [k for k in shared if not torch.equal(body[k], body_ref[k])]
        if unequal:
            broken.append(f"final tensors differ from the fault-free run's: {unequal[:5]}")
        if per_source != figures["reference_val_bpb"]:
            broken.append(f"bits per byte differ: {per_source} vs {figures['reference_val_bpb']}")
    elif not abs(gap) <= BPB_TOLERANCE:
        broken.append(
            f"average bpb {gap:+.2%} from the fault-free run's after as many rounds "
            f"(> {BPB_TOLERANCE:.0%}): {per_source} vs {expected}, rounds {trained}"
        )
    return figures, broken


def _rounds(out: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl``'s rounds, the last line of each (a resumed server rewrites those
    after the checkpoint it resumed from), in round order."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    last = {int(line["round"]): line for line in map(json.loads, lines)}
    return [last[r] for r in sorted(last)]


def trained_rounds(out: Path) -> dict[str, int]:
    """Per source, the rounds whose update from it the run took."""
    counts: dict[str, int] = {}
    for line in _rounds(out):
        for source, metrics in line["sources"].items():
            counts[source] = counts.get(source, 0) + bool(metrics.get("tokens"))
    return counts


def bpb_after_rounds(lines: list[dict[str, Any]], source: str, rounds: int) -> float | None:
    """``source``'s bits per byte in the first evaluation after its ``rounds``-th trained
    round, in a run's rounds (:func:`_rounds`); None: it never trained that many, or no
    evaluation followed."""
    done = 0
    for line in lines:
        metrics = line["sources"].get(source, {})
        done += bool(metrics.get("tokens"))
        value = metrics.get("val_bpb")
        if done >= rounds and value is not None and math.isfinite(value):
            return float(value)
    return None


def _mean(values: Iterable[float]) -> float:
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
