"""The server's side of partial synchronisation (:mod:`dept.wire.fragments`): each fragment's
version, which versions each source holds, and so what each train message carries.

Rule for the download: a source is sent the fragments whose version is newer than what it
held after its last accepted round; a source with no accepted round in this run, or whose
last reply was an error (it may have lost its state), is sent the whole body. A node that
holds more than the server knows (its reply was refused after it trained) keeps its own
where the versions match, so sending too much is harmless; one that holds less fails its
round (:func:`dept.wire.fragments.start_body`) and gets the whole body next time.

The upload carries Δ of the round's synced fragments only (:meth:`FragmentVersions.round_names`),
plus φ where the variant shares it, which is never fragmented.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ConfigRecord

from dept.wire import keys
from dept.wire.fragments import FragmentPlan, partition, synced_spans, syncing


class FragmentVersions:
    """Versions of the ``count`` fragments of ``body`` (tensor names) and what each source
    holds; a fragment syncs every ``period`` rounds, and all of them in ``last_round``."""

    def __init__(self, body: list[str], *, count: int, period: int, last_round: int = 0) -> None:
        if not 1 <= period <= count:
            raise ValueError(f"'fragment-period' is {period}; expected 1..{count} (fragments)")
        self.count, self.period, self.last_round = count, period, last_round
        self.parts = partition(body, count)
        self.versions = [0] * count  # the round each global fragment last changed
        self.held: dict[str, list[int]] = {}  # source → versions after its last accepted round

    def plan(self, server_round: int) -> FragmentPlan:
        return FragmentPlan(tuple(self.versions), self._syncing(server_round))

    def _syncing(self, server_round: int) -> tuple[int, ...]:
        return syncing(server_round, self.count, self.period, self.last_round)

    def configure(self, config: ConfigRecord, server_round: int) -> None:
        """Put the round's plan into a train message's config."""
        plan = self.plan(server_round)
        config[keys.FRAGMENT_VERSIONS] = list(plan.versions)
        config[keys.FRAGMENT_SYNC] = list(plan.sync)

    def round_names(self, server_round: int) -> set[str]:
        """Body tensors whose Δ the replies of ``server_round`` carry."""
        sync = set(self._syncing(server_round))
        return {n for n, f in self.parts.items() if f in sync}

    def spans(self, server_round: int) -> dict[str, range]:
        """The rounds each synced tensor's Δ can hold in ``server_round``
        (:func:`dept.wire.fragments.synced_spans`), from the versions as planned and sent, before
        the round's step changes them: the server's own record, never a reply's word."""
        return synced_spans(self.parts, self.plan(server_round), server_round)

    def unsent(self, source: str) -> set[str]:
        """Body tensors ``source`` already holds at their current version (not sent)."""
        held = self.held.get(source)
        if held is None:
            return set()
        return {n for n, f in self.parts.items() if held[f] == self.versions[f]}

    def stepped(self, server_round: int) -> None:
        """The outer step of ``server_round`` changed its synced fragments."""
        for fragment in self._syncing(server_round):
            self.versions[fragment] = server_round

    def took(self, source: str, versions: list[int]) -> None:
        """An accepted reply: ``source`` trained from these versions and keeps them."""
        self.held[source] = list(versions)

    def forget(self, source: str) -> None:
        """``source`` answered with an error: send it the whole body next time."""
        self.held.pop(source, None)

    def state_dict(self) -> dict[str, Any]:
        return {"versions": list(self.versions), "held": dict(self.held)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["versions"]) != self.count:
            raise ValueError(
                f"the checkpoint has {len(state['versions'])} fragments, not {self.count}"
            )
        self.versions = [int(v) for v in state["versions"]]
        self.held = {s: [int(v) for v in held] for s, held in state["held"].items()}
