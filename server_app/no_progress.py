"""A round in which no source trained is no round, and a run that keeps having them stops.

Such a round leaves the model as it was; the loop (:mod:`server_app.federation`) neither
evaluates nor checkpoints it, and tries it again up to ``empty-round-retries`` times in a
row. Then the run stops with :class:`NothingTrained`: its one line gives the round and the
reasons the nodes and the server gave (each once; a full disk is named there with its folder
and free space by whoever was writing, :mod:`dept.state.disks`). ``dept run`` adds the
command that resumes after the last checkpointed round, which redoes the rounds that
trained nothing.
"""

from __future__ import annotations

from server_app.run_status import RunFailed


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
