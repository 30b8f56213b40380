"""A round in which no source trained is no round, and a run that cannot go on stops.

Such a round leaves the model as it was; the loop (:mod:`server_app.federation`) neither
evaluates nor checkpoints it, and tries it again up to ``empty-round-retries`` times in a
row. Then the run stops with :class:`NothingTrained`: its one line gives the round and the
reasons the nodes and the server gave (each once; a full disk is named there with its folder
and free space by whoever was writing, :mod:`dept.state.disks`). ``dept run`` adds the
command that resumes after the last checkpointed round, which redoes the rounds that
trained nothing.

A reply the server could not write to its own disk (its spool, in ``output-dir``) is no
node's fault, and a round made of the replies that happened to fit would train the sources
the disk's free bytes picked, round after round, while the disk stays full: the run stops
with :class:`ServerDiskFull` before the round is evaluated or checkpointed, naming the disk,
and a resumed run redoes the round once there is space.

A simulation worker (a Ray actor) that died is not replaced by Flower 1.42: every later
message to the nodes it ran fails ("The actor is dead ..."), so the run would go on with
fewer and fewer sources and end as if it had finished. The round in which one died is
checkpointed as usual where anything trained (what trained, trained; else it is no round),
and the run stops with :class:`WorkerDied`; a resumed run starts with fresh workers.
"""

from __future__ import annotations

import re

from dept_strategy.replies import NOT_KEPT
from server_app.run_status import RunFailed

# how Ray says a worker is gone, in the reasons of the error replies it makes
DEAD_WORKER = re.compile(r"ActorDiedError|RayActorError|The actor is dead|actor died")


class NothingTrained(RunFailed):
    """Rounds in a row trained nothing; the message is the one line to show."""


def nothing_trained(server_round: int, tries: int, reasons: str, retries: int) -> NothingTrained:
    """The error that stops a run whose round ``server_round`` trained nothing ``tries``
    times in a row (``retries``: the config key's value)."""
    where = (
        "round 1 (a setup error: it is not tried again)"
        if server_round == 1
        else f"round {server_round}, tried {tries} times (config key 'empty-round-retries' "
        f"is {retries})"
    )
    return NothingTrained(f"no source trained in {where}: {reasons or 'no reply'}")


class WorkerDied(RunFailed):
    """A simulation worker died; the message is the one line to show."""


def dead_worker(server_round: int, failures: list[dict[str, str]]) -> WorkerDied | None:
    """The error that stops a run after ``server_round`` when one of its ``failures`` (the
    round's, from its history) says a simulation worker died; None otherwise."""
    dead = [f for f in failures if DEAD_WORKER.search(f.get("reason", ""))]
    if not dead:
        return None
    sources = sorted({f["source"] for f in dead if f.get("source")})
    which = f" (sources {', '.join(sources)} could not train)" if sources else ""
    return WorkerDied(
        f"a simulation worker died in round {server_round}{which}: "
        f"{dead[0]['reason'].split('. ')[0]}; a resumed run starts with fresh workers"
    )


class ServerDiskFull(RunFailed):
    """Replies the server could not keep on its own disk; the message is the line to show."""


def server_disk_full(server_round: int, rejected: list[dict[str, str]]) -> ServerDiskFull | None:
    """The error that stops a run whose round ``server_round`` refused a reply for want of
    the server's own disk (``rejected``: the round's refused replies); None otherwise."""
    lost = [r for r in rejected if r.get("reason", "").startswith(NOT_KEPT)]
    if not lost:
        return None
    sources = ", ".join(sorted({r.get("source", "?") for r in lost}))
    return ServerDiskFull(
        f"round {server_round}: {NOT_KEPT}, the reply of {sources} "
        f"{lost[0]['reason'].removeprefix(NOT_KEPT).strip()}; the round is not kept, and a "
        "resumed run redoes it once there is space"
    )
