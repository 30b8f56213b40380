"""Combining a round: the running weighted mean, its refold from the spool, the robust rules,
and the spool itself."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dept_strategy.aggregate import RunningMean, combine
from dept_strategy.screening import UpdateSizes
from dept_strategy.spool import RoundSpool, Spooled

SHAPES = {"w": (3, 2), "b": (4,)}


def _delta(value: float, shapes: dict = SHAPES) -> dict[str, np.ndarray]:
    return {n: np.full(s, value, np.float32) for n, s in shapes.items()}


def _spool(
    spool: RoundSpool, delta: dict[str, np.ndarray], weight: float, rows: np.ndarray | None = None
) -> Spooled:
    tally = UpdateSizes(("input",))
    path, layout = spool.write(tally.observe(delta.items()))
    return Spooled(path, weight, rows, tally.stats(), layout)


def _arrive(spool: RoundSpool, running: RunningMean, delta: dict, weight: float) -> Spooled:
    """A reply as the strategy takes it in: spooled, then folded in from its own arrays."""
    spooled = _spool(spool, delta, weight)
    running.add(spooled, delta.items())
    return spooled


def test_the_mean_is_token_weighted_and_the_folder_goes_with_the_round(tmp_path: Path) -> None:
    folder = tmp_path / "round-0001"
    with RoundSpool(folder) as spool:
        running = RunningMean(SHAPES)
        kept = [_arrive(spool, running, _delta(v), w) for v, w in ((1.0, 1), (5.0, 3))]
        assert len(list(folder.iterdir())) == 2, "each reply waits on disk"
        combined, frozen = combine(kept, SHAPES, (), running)
    assert not folder.exists()
    assert frozen == {}
    assert np.allclose(combined["w"].numpy(), (1 * 1.0 + 3 * 5.0) / 4)
    assert np.shares_memory(combined["b"].numpy(), running.means["b"]), "no copy of the sum"


def test_a_clipped_or_dropped_reply_refolds_the_mean_from_disk(tmp_path: Path) -> None:
    with RoundSpool(tmp_path / "r") as spool:
        running = RunningMean(SHAPES)
        kept = [_arrive(spool, running, _delta(v), 1) for v in (1.0, 3.0, 1e6)]
        buffer = running.means["w"]
        clipped, _ = combine([*kept[:2], replace(kept[2], scale=2e-6)], SHAPES, (), running)
        assert np.allclose(clipped["w"].numpy(), (1.0 + 3.0 + 2.0) / 3)
        dropped, _ = combine(kept[:2], SHAPES, (), running)
    assert np.allclose(dropped["w"].numpy(), 2.0) and running.means["w"] is buffer


def test_the_mean_of_values_near_the_float32_limit_does_not_overflow(tmp_path: Path) -> None:
    with RoundSpool(tmp_path / "r") as spool:
        running = RunningMean(SHAPES)
        kept = [_arrive(spool, running, _delta(v), 1) for v in (3e38, 3.2e38, -3e38)]
        combined, _ = combine(kept, SHAPES, (), running)
    assert np.allclose(combined["w"].numpy(), 3.2e38 / 3, rtol=1e-6)


def test_the_mean_folds_a_tensor_in_chunks_the_same_as_whole(tmp_path, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    deltas = [{"w": rng.standard_normal((50, 7)).astype(np.float32)} for _ in range(3)]
    monkeypatch.setattr("dept_strategy.aggregate.CHUNK_VALUES", 16)
    with RoundSpool(tmp_path / "r") as spool:
        running = RunningMean({"w": (50, 7)})
        kept = [_arrive(spool, running, d, w) for d, w in zip(deltas, (1, 2, 5), strict=True)]
        combined, _ = combine(kept, {"w": (50, 7)}, (), running)
    expected = (deltas[0]["w"] + 2 * deltas[1]["w"] + 5 * deltas[2]["w"]) / 8
    assert np.allclose(combined["w"].numpy(), expected, atol=1e-6)


@pytest.mark.parametrize(("rule", "expected"), [("median", 3.0), ("trimmed-mean", 8 / 3)])
def test_robust_rules_ignore_one_extreme_source(tmp_path: Path, rule: str, expected: float) -> None:
    with RoundSpool(tmp_path / "r") as spool:
        kept = [_spool(spool, _delta(v), 1) for v in (2.0, 3.0, 4.0, -1000.0, 3.0)]
        combined, _ = combine(kept, SHAPES, (), None, rule=rule, trim_fraction=0.2)
    for name in SHAPES:
        assert np.allclose(combined[name].numpy(), expected), (rule, name)


def test_robust_rules_read_in_chunks_the_same_as_whole(tmp_path: Path, monkeypatch) -> None:
    rng = np.random.default_rng(0)
    deltas = [{"w": rng.standard_normal((50, 7)).astype(np.float32)} for _ in range(5)]
    with RoundSpool(tmp_path / "r") as spool:
        kept = [_spool(spool, d, 1) for d in deltas]
        monkeypatch.setattr("dept_strategy.aggregate.CHUNK_VALUES", 64)  # 1 row per chunk
        median, _ = combine(kept, {"w": (50, 7)}, (), None, rule="median")
        trimmed, _ = combine(kept, {"w": (50, 7)}, (), None, rule="trimmed-mean", trim_fraction=0.2)
    stack = np.stack([d["w"] for d in deltas])
    assert np.allclose(median["w"].numpy(), np.median(stack, axis=0))
    assert np.allclose(trimmed["w"].numpy(), np.sort(stack, axis=0)[1:4].mean(axis=0))


@pytest.mark.parametrize("rule", ["mean", "median"])
def test_row_tensors_average_each_row_over_its_holders(tmp_path: Path, rule: str) -> None:
    shapes = {"input": (4, 2), "b": (3,)}
    sent = [({"input": (2, 2), "b": (3,)}, v, w, np.array(r)) for v, w, r in ((1.0, 1, [0, 1]),)]
    sent.append(({"input": (2, 2), "b": (3,)}, 3.0, 3, np.array([1, 2])))
    sent.append(({"input": (1, 2), "b": (3,)}, 9.0, 1, np.array([2])))
    with RoundSpool(tmp_path / "r") as spool:
        running = RunningMean(shapes, ("input",)) if rule == "mean" else None
        kept = []
        for reply_shapes, value, weight, rows in sent:
            kept.append(_spool(spool, _delta(value, reply_shapes), weight, rows))
            if running is not None:
                running.add(kept[-1], _delta(value, reply_shapes).items())
        combined, frozen = combine(kept, shapes, ("input",), running, rule=rule)
    phi = combined["input"].numpy()
    assert np.allclose(phi[0], 1.0) and np.allclose(phi[1], 2.5) and np.allclose(phi[2], 4.5)
    assert frozen["input"].tolist() == [False, False, False, True]
    assert np.allclose(combined["b"].numpy(), 3.0 if rule == "median" else 19 / 5)


def test_a_reply_that_fails_while_written_leaves_no_file(tmp_path: Path) -> None:
    def tensors():
        yield "w", np.ones((3, 2), np.float32)
        raise ValueError("the second tensor does not decode")

    with RoundSpool(tmp_path / "r") as spool:
        with pytest.raises(ValueError, match="does not decode"):
            spool.write(tensors())
        assert not list((tmp_path / "r").iterdir())
        whole = _spool(spool, {"w": np.arange(6, dtype=np.float32).reshape(3, 2)}, 1)
        assert whole.read("w", 1, 3).tolist() == [[2.0, 3.0], [4.0, 5.0]]
        whole.path.write_bytes(whole.path.read_bytes()[:-4])
        with pytest.raises(OSError, match="ends before"):
            whole.read("w")


def test_replies_that_come_out_of_order_are_folded_in_source_order_reading_only_the_early_ones(
    tmp_path: Path, monkeypatch
) -> None:
    # Prepare: three sources whose float32 mean rounds differently by order; c arrives first
    rng = np.random.default_rng(1)
    deltas = {s: {"w": rng.standard_normal((40, 3)).astype(np.float32)} for s in "abc"}
    weights = {"a": 1.0, "b": 3.0, "c": 7.0}
    reads: list[Path] = []
    tensors = Spooled.tensors
    monkeypatch.setattr(Spooled, "tensors", lambda self: reads.append(self.path) or tensors(self))
    with RoundSpool(tmp_path / "r") as spool:
        running = RunningMean({"w": (40, 3)}, order=["a", "b", "c"])
        spooled = {}
        # Execute
        for source in "cab":  # the order the replies come in
            spooled[source] = _spool(spool, deltas[source], weights[source])
            running.offer(source, spooled[source], deltas[source].items())
        combined, _ = combine([spooled[s] for s in "abc"], {"w": (40, 3)}, (), running)
        in_order = RunningMean({"w": (40, 3)})
        for source in "abc":
            in_order.add(spooled[source], deltas[source].items())
        # Assert
        assert reads == [spooled["c"].path], "only the reply that came early is read back"
        assert np.array_equal(combined["w"].numpy(), in_order.means["w"])
