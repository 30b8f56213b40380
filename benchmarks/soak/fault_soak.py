"""Fault soak: a loopback deployment trained through a stream of injected failures.

One SuperLink and four SuperNodes (each with its executor and warm worker), the ``debug``
model, short rounds. At seeded random times the soak kills a SuperNode, an executor, a warm
worker or the ServerApp (then resumes the run), pauses a SuperNode past Flower's heartbeat
window (a partition), or corrupts a source's newest round state or the server's newest
checkpoint (then kills and resumes the server, which must pass over it). At the end it
checks that every round finished, that no source restarted its embeddings unless a fault
caused it (``summary.json`` lists each source's fresh starts), that the result equals its
participation twin's bit for bit (the same rounds of each source, from the same states,
trained in process without faults: :mod:`benchmarks.soak.reference`), and that nothing is
left behind: no process, held lock, socket or temporary folder. ::

    python -m benchmarks.soak.fault_soak --rounds 60 --faults 100        # the long soak
    python -m benchmarks.soak.fault_soak --rounds 8 --faults 10 --loopback-supernodes  # CI's

Results: ``fault_soak.json`` and ``inject.csv`` in ``--out``, and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.measure import RESULTS
from benchmarks.soak import checks
from benchmarks.soak import faults as inject
from benchmarks.soak.reference import absences, fallbacks, run_reference
from benchmarks.soak.report import by_kind, render, write
from benchmarks.soak.watch import Fault, Rounds
from dept.logs import log_to_terminal
from server_app.checkpoint import CHECKPOINTS, TENSORS_FILE
from server_app.flower_commands import HEARTBEAT_S
from tests.deploy.loopback import SERVER_DONE, Loopback, Node, node_config, run_config

log = logging.getLogger(__name__)
SOURCES = ("latin", "cyrillic", "greek", "georgian")
# A partition outlasts the heartbeat window: Flower 1.42 drops a node after 2 missed
# heartbeats, of 30 s on its own SuperNode, of HEARTBEAT_S on the loopback one
PARTITION_S = 70.0
LOOPBACK_PARTITION_S = 2 * HEARTBEAT_S + 5.0
POLL_S = 0.5
GRACE_S = 20.0  # a SIGTERMed process's time to exit cleanly at the end
RESUMED = re.compile(r"resuming run \S+ after round (\d+)")
# The nodes' executor, as docs/deployment.md starts it (ClientApps forked warm). A node one
# reply behind whose first nudge is answered before its training is nudged again
# (server_app.nudges): one CI soak stalled a round without that (stop 59).
NODE_EXECUTOR = ("dept", "superexec")
DISK_SIZE = "64m"  # each small disk: a node's state, the server's output
MIN_TIMEOUT_S = 1800.0
# The hundred-fault soak took 42 s a fault (70 min); one past twice that has stopped moving.
TIMEOUT_S_PER_FAULT = 90.0
FILLER = ".filler"  # what fills one (benchmarks.soak.faults.fill)


@dataclass(frozen=True)
class Options:
    work: Path  # the deployment's folders (state, logs, output); removed by the caller
    rounds: int = 8
    faults: int = 10
    seed: int = 0
    local_steps: int = 4
    gap_s: float = 6.0  # mean time between injections
    partition_s: float | None = None  # default: past the nodes' heartbeat window
    # the SuperNode `dept run --federation processes` starts (tests.deploy.loopback): the
    # same faults, found three times sooner; the long soak runs Flower's own
    loopback_supernodes: bool = False
    # the SuperLink's state in Flower's in-memory store, not the database file a deployment
    # keeps (no fault here touches the SuperLink): the file's SQL took a third of a core, a
    # quarter of the CI soak's CPU (docs/robustness.md)
    superlink_in_memory: bool = False
    kinds: tuple[str, ...] = inject.KINDS
    timeout_s: float = MIN_TIMEOUT_S
    full_s: float = 20.0  # how long a node's state disk stays full
    # fault-free runs under seeds 0, 1, ..., their spread recorded beside the result
    reference_seeds: int = 0


@dataclass
class Soak:
    """One deployment and the faults injected into it."""

    deployment: Loopback
    opts: Options
    nodes: dict[str, Node] = field(default_factory=dict)
    injected: list[Fault] = field(default_factory=list)
    paused: dict[str, float] = field(default_factory=dict)  # source: when to SIGCONT it
    filled: dict[str, tuple[Path, float]] = field(default_factory=dict)  # (filler, free at)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.opts.seed)
        self.state, self.out = self.opts.work / "state", self.opts.work / "run"
        self.rounds = Rounds(self.out / "metrics.jsonl")
        self.queue: list[str] = []
        self.started = time.monotonic()
        self.kinds, self.disks, self.no_disks = self.opts.kinds, list[Path](), ""
        self.unsubmitted: list[Fault] = []  # output-disk-full faults whose run is not resumed
        window = LOOPBACK_PARTITION_S if self.opts.loopback_supernodes else PARTITION_S
        self.partition_s = window if self.opts.partition_s is None else self.opts.partition_s

    def small_disks(self) -> str:
        """Each node's state folder and the output folder on a small disk of its own, for
        the disk faults; "" when they are, else why not (those kinds are then left out)."""
        if not set(self.kinds) & set(inject.DISK_KINDS):
            return ""
        for folder in (self.out, *(self.state / s for s in SOURCES)):
            why = inject.small_disk(folder, DISK_SIZE)
            if why:
                self.kinds = tuple(k for k in self.kinds if k not in inject.DISK_KINDS)
                return why
            self.disks.append(folder)
        return ""

    def release_disks(self) -> None:
        for folder in self.disks:
            inject.unmount(folder)

    def run_config(self, resume: bool = False) -> str:
        overrides: dict[str, object] = {
            "num-server-rounds": self.opts.rounds,
            "local-steps": self.opts.local_steps,
            "fraction-evaluate": 0.0,  # every source is scored before and after the run
            "min-available-nodes": len(SOURCES),
            # also how long discovery waits on a query: a node killed with one pending holds
            # a resumed server this long (a found limit, see the module's note)
            "wait-for-nodes-s": 120.0,
            # a lost reply is answered by the SuperLink (a dead node) or the upload's
            # expiry (a node killed mid-upload, 180 s); this is only the backstop
            "round-timeout-s": 400.0,
        }
        return run_config(self.out, **overrides, **({"resume": True} if resume else {}))

    def start(self) -> None:
        self.no_disks = self.small_disks()
        if self.no_disks:
            log.warning("no disk faults: no small disks here (%s)", self.no_disks)
        self.deployment.start_superlink()
        for source in SOURCES:
            self.nodes[source] = self.deployment.add_node(source, node_config(source, self.state))
        self.server_run = self.deployment.run(self.run_config())

    def soak(self) -> None:
        """Inject until enough faults, and until the run has finished every round."""
        deadline = self.started + self.opts.timeout_s
        next_at = self.started + self._gap()
        while not self._finished():
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"the soak ran past {self.opts.timeout_s:.0f} s")
            self.rounds.poll()
            self._continue_partitions(now)
            self._free_disks(now)
            self._resume_after_a_full_disk()
            self._note_resume()
            for fault in self.injected:
                self.rounds.settle(fault)
            if len(self.injected) < self.opts.faults and now >= next_at and self._inject():
                next_at = now + self._gap()
            time.sleep(POLL_S)
        self.resume_partitions()
        self.rounds.poll()
        for fault in self.injected:
            self.rounds.settle(fault)

    def _output_full(self) -> bool:
        """Whether an output-disk-full fault waits for its run to stop and be resumed."""
        return bool(self.unsubmitted)

    def _free_disks(self, now: float) -> None:
        """Free each node's state disk whose time full is up."""
        for source, (filler, until) in list(self.filled.items()):
            if now >= until:
                filler.unlink(missing_ok=True)
                del self.filled[source]

    def _resume_after_a_full_disk(self) -> None:
        """The server stops when its output disk is full (its rounds trained nothing, or a
        checkpoint could not be written): free the disk and resume the run."""
        if not self._output_full() or self.server_run.popen.poll() is None:
            return
        (self.out / FILLER).unlink(missing_ok=True)
        self._resubmit()
        self.unsubmitted.clear()  # the resumed run's log says which checkpoint it took

    def _gap(self) -> float:
        return self.rng.uniform(0.5, 1.5) * self.opts.gap_s

    def _finished(self) -> bool:
        """Whether the run has finished; raises if its ``flwr run`` ended any other way (a
        run this soak killed, or stopped with a full disk, is resubmitted before this is
        asked again)."""
        if self.server_run.popen.poll() is None or self._output_full():
            return False
        if re.search(SERVER_DONE, self.server_run.text()) is None:
            raise RuntimeError(f"the run ended unfinished:\n{self.server_run.text()[-3000:]}")
        return True

    def _pending(self, target: str) -> bool:
        return any(f.target == target and f.recovered_at is None for f in self.injected)

    def _inject(self) -> bool:
        """One fault of the next kind that has a target now; whether one was injected."""
        if not self.queue:
            self.queue = self.rng.sample(self.opts.kinds, len(self.opts.kinds))
        for kind in self.queue:
            target = self._target(kind)
            if target is None:
                continue
            self.queue.remove(kind)
            fault = Fault(kind, target, time.monotonic(), self.rounds.done)
            fault.detail = self._do(fault)
            self.injected.append(fault)
            log.info(
                "fault %d: %s %s after round %d: %s",
                len(self.injected),
                kind,
                target,
                fault.done_before,
                fault.detail,
            )
            return True
        return False

    def _target(self, kind: str) -> str | None:
        """Who ``kind`` can hit now: a fault needs a round after it to show its recovery,
        and a target whose last fault has not yet recovered is left alone."""
        done, last = self.rounds.done, self.opts.rounds
        if kind in inject.SERVER_KINDS:
            usable = self._checkpoints() >= (2 if kind == inject.CHECKPOINT else 1)
            ok = usable and done < last - 1 and not self._pending("server")
            return "server" if ok else None
        if done < 0 or done >= last - 2 or (kind == inject.PARTITION and self.paused):
            return None
        away = self.paused.keys() | self.filled.keys()
        free = [s for s in SOURCES if not self._pending(s) and s not in away]
        if kind == inject.WORKER:
            free = [s for s in free if self._workers(s)]
        if kind == inject.CLIENT_STATE:
            free = [s for s in free if self._round_state(s) is not None]
        return self.rng.choice(free) if free else None

    def _do(self, fault: Fault) -> str:
        """Inject ``fault``; what was hit, for the record."""
        kind, target = fault.kind, fault.target
        if kind == inject.OUTPUT_FULL:
            filler = inject.fill(self.out)
            self.unsubmitted.append(fault)
            return f"{filler.stat().st_size >> 10} KiB filled the output folder's disk"
        if kind in inject.SERVER_KINDS:
            detail = self._corrupt_checkpoint() if kind == inject.CHECKPOINT else ""
            return detail + self._kill_server()
        node = self.nodes[target]
        if kind == inject.STATE_FULL:
            filler = inject.fill(self.state / target)
            self.filled[target] = (filler, time.monotonic() + self.opts.full_s)
            return f"state disk full for {self.opts.full_s:.0f} s"
        if kind == inject.SUPERNODE:
            node.supernode.kill()
            self.deployment.restart_supernode(node)
            return f"supernode {node.supernode.popen.pid} restarted"
        if kind == inject.EXECUTOR:
            group = node.superexec.popen.pid
            apps = [p.pid for p in inject.find(group, "flwr-clientapp")]
            inject.kill([group, *apps])
            node.superexec.popen.wait(timeout=10)
            self.deployment.restart_superexec(node)
            return f"superexec {group} and {len(apps)} clientapp(s) killed"
        if kind == inject.WORKER:
            pids = self._workers(target)
            inject.kill(pids)
            return f"worker {pids} killed"
        if kind == inject.PARTITION:
            os.killpg(node.supernode.popen.pid, signal.SIGSTOP)
            self.paused[target] = time.monotonic() + self.partition_s
            return f"supernode paused {self.partition_s:.0f} s"
        state = self._round_state(target)
        assert state is not None, "chosen only with a round state"
        inject.corrupt(state, self.rng.randrange(1 << 16))
        return str(state.relative_to(self.state))

    def _workers(self, source: str) -> list[int]:
        group = self.nodes[source].superexec.popen.pid
        return [p.pid for p in inject.find(group, "client_app.worker")]

    def _round_state(self, source: str) -> Path | None:
        newest = inject.newest_round_dir(self.state / source / "runs")
        state = newest / "embeddings.safetensors" if newest else None
        return state if state is not None and state.is_file() else None

    def _checkpoints(self) -> int:
        return len(list((self.out / CHECKPOINTS).glob("round-[0-9]*")))

    def _corrupt_checkpoint(self) -> str:
        newest = inject.newest_round_dir(self.out / CHECKPOINTS)
        assert newest is not None, "chosen only with a checkpoint"
        inject.corrupt(newest / TENSORS_FILE, self.rng.randrange(1 << 16))
        return f"{newest.name} corrupted; "

    def _server_group(self) -> int:
        superexec = next(p for p in self.deployment.processes if p.name == "superexec-serverapp")
        return superexec.popen.pid

    def _kill_server(self) -> str:
        """SIGKILL the ServerApp process, then submit the run again with ``resume``."""
        apps = [p.pid for p in inject.find(self._server_group(), "flwr-serverapp")]
        inject.kill(apps)
        self.server_run.kill()  # the CLI streaming the dead run's log
        self._resubmit()
        return f"serverapp {apps} killed, resumed"

    def _resubmit(self) -> None:
        """Submit the run again with ``resume``."""
        attempt = sum(p.name.startswith("flwr-run") for p in self.deployment.processes)
        self.server_run = self.deployment.run(self.run_config(resume=True), f"flwr-run-{attempt}")

    def _note_resume(self) -> None:
        """Which checkpoint the resumed server took, once its log says (a fault whose run
        is not resubmitted yet waits: the log is still the run before it)."""
        for fault in self.injected:
            if fault.target == "server" and fault.resumed_after is None:
                if any(f is fault for f in self.unsubmitted):
                    continue
                found = RESUMED.search(self.server_run.text())
                if found:
                    fault.resumed_after = int(found.group(1))

    def _continue_partitions(self, now: float) -> None:
        for source, until in list(self.paused.items()):
            if now >= until:
                os.killpg(self.nodes[source].supernode.popen.pid, signal.SIGCONT)
                del self.paused[source]

    def copy_off_disks(self) -> None:
        """The run's files onto the work folder's own disk, the small disks let go."""
        for folder in self.disks:
            kept = folder.with_name(f".{folder.name}-kept")
            shutil.copytree(folder, kept, symlinks=True, ignore=shutil.ignore_patterns(FILLER))
            inject.unmount(folder)
            shutil.rmtree(folder, ignore_errors=True)
            kept.rename(folder)
        self.disks = []

    def rows(self) -> list[dict[str, Any]]:
        return [f.as_row(self.started) for f in self.injected]

    def resume_partitions(self) -> None:
        """SIGCONT every paused SuperNode and free every full disk (at the end, also of a
        failed soak)."""
        self._continue_partitions(float("inf"))
        self._free_disks(float("inf"))


def run_soak(opts: Options) -> dict[str, Any]:
    """The soak, its fault-free twin and the checks; the results (:func:`write`)."""
    shutil.rmtree(opts.work, ignore_errors=True)
    # its processes' TMPDIR is work/tmp: what they leave is ours
    deployment = Loopback(
        opts.work,
        executor=NODE_EXECUTOR,
        loopback_supernodes=opts.loopback_supernodes,
        database=not opts.superlink_in_memory,
    )
    soak = Soak(deployment, opts)
    try:
        soak.start()
        soak.soak()
    except BaseException:
        soak.resume_partitions()
        deployment.close(GRACE_S)
        soak.release_disks()
        raise
    soak.resume_partitions()
    groups = [p.popen.pid for p in deployment.processes]
    deployment.close(GRACE_S)
    left = checks.leftovers(opts.work, groups)
    soak.copy_off_disks()
    wall_s = time.monotonic() - soak.started
    absent, fallback = absences(soak.out, SOURCES), fallbacks(soak.out)
    twin = run_reference(soak.out, opts.work / "twin", SOURCES, absent=absent, fallback=fallback)
    figures, off = checks.compare(soak.out, twin)
    figures["absent"], figures["fallback"] = absent, fallback
    seeds = [
        run_reference(soak.out, opts.work / f"reference-{seed}", SOURCES, seed=seed)
        for seed in range(opts.reference_seeds)
    ]
    if seeds:  # for the record: the scale a tolerance would have had (checks.compare)
        figures["reference_seeds"] = {
            str(s): checks.average(checks.final_bpb(run).values()) for s, run in enumerate(seeds)
        }
        figures["reference_spread"] = checks.spread(seeds) if len(seeds) > 1 else None
    summary = json.loads((soak.out / "summary.json").read_text())
    rows = soak.rows()
    return {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()},
        "wall_s": round(wall_s, 1),
        "faults": rows,
        "by_kind": by_kind(rows),
        "final": figures,
        "fresh_starts": {s: m["fresh_starts"] for s, m in summary["sources"].items()},
        "checks": {
            "all_rounds": [] if summary["rounds"] == opts.rounds else [f"{summary['rounds']}"],
            "all_faults": too_few_faults(len(rows), opts),
            "unrecovered": [f"{r['kind']} {r['target']}" for r in rows if r["recovery_s"] is None],
            "state_events": checks.unexplained_state_events(summary, soak.injected),
            "result": off,
            "leftovers": left,
        },
        "kinds": list(soak.kinds),
        **({"disks": soak.no_disks} if soak.no_disks else {}),
    }


def too_few_faults(injected: int, opts: Options) -> list[str]:
    """The run ends the soak: one that finished before every fault asked for was injected
    soaked less than it says, and this says by how much and what to give it."""
    if injected >= opts.faults:
        return []
    return [
        f"{injected} of {opts.faults} faults injected before the run's {opts.rounds} rounds "
        "were done: give it more --rounds"
    ]


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak.fault_soak", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--local-steps", type=int, default=4)
    parser.add_argument("--gap-s", type=float, default=6.0, help="mean time between faults")
    parser.add_argument(
        "--partition-s",
        type=float,
        default=None,
        help=f"how long a partition lasts (default: {PARTITION_S:.0f} s, "
        f"{LOOPBACK_PARTITION_S:.0f} s with --loopback-supernodes)",
    )
    parser.add_argument(
        "--loopback-supernodes",
        action="store_true",
        help="run the SuperNode dept run --federation processes starts (heartbeats every "
        f"{HEARTBEAT_S} s, not 30 s): the same faults, found sooner (the CI soak)",
    )
    parser.add_argument(
        "--superlink-in-memory",
        action="store_true",
        help="keep the SuperLink's state in memory, not in a database file (the CI soak)",
    )
    parser.add_argument("--full-s", type=float, default=20.0, help="a node's disk full this long")
    parser.add_argument("--kinds", default=",".join(inject.KINDS), help="comma-separated")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help=f"give up after this long (default: {MIN_TIMEOUT_S:.0f} s, or "
        f"{TIMEOUT_S_PER_FAULT:.0f} s a fault where that is more)",
    )
    parser.add_argument(
        "--reference-seeds",
        type=int,
        default=0,
        help="also train the fault-free run under this many seeds and record their spread",
    )
    parser.add_argument("--work", type=Path, required=True, help="scratch folder (emptied)")
    parser.add_argument("--out", type=Path, default=RESULTS / "fault-soak")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    log_to_terminal("%(asctime)s %(message)s")
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = sorted(set(kinds) - set(inject.KINDS))
    if unknown:
        raise SystemExit(f"unknown fault kinds {unknown}; known: {', '.join(inject.KINDS)}")
    named = (
        "work",
        "rounds",
        "faults",
        "seed",
        "local_steps",
        "gap_s",
        "partition_s",
        "timeout_s",
        "reference_seeds",
        "full_s",
        "loopback_supernodes",
        "superlink_in_memory",
    )
    if args.timeout_s is None:
        args.timeout_s = max(MIN_TIMEOUT_S, TIMEOUT_S_PER_FAULT * args.faults)
    opts = Options(kinds=kinds, **{k: getattr(args, k) for k in named})
    result = run_soak(opts)
    write(result, args.out)
    print(render(result))
    return 1 if any(result["checks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
