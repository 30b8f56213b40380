"""poisoning.py: a tampering node is caught and named; the honest run is not, and the tamper
functions send what their labels say."""

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.comparison.poisoning import DEFAULT_ATTACKS, change, culprits, head_and_tail, main
from benchmarks.comparison.tampers import DEFENDED, attacks, scaled, signs_only
from dept.data.sources import SourceSpec
from dept.wire.compression import SCALE_SUFFIX
from tests.helpers import share_cache


def _update() -> dict[str, np.ndarray]:
    return {
        "w": np.array([[0.5, -2.0], [0.0, 1e-3]], np.float32),
        "b": np.array([-0.25, 1.5], np.float32),
        f"w{SCALE_SUFFIX}": np.array([0.1], np.float32),
    }


def test_signs_only_keeps_the_signs_at_the_updates_largest_size() -> None:
    update = _update()

    sent = signs_only(update)

    for name in ("w", "b"):
        assert np.array_equal(np.sign(sent[name]), np.sign(update[name]))
        assert set(np.abs(sent[name]).ravel()) <= {0.0, 2.0}  # 2.0: the largest |value|
        assert sent[name].dtype == np.float32
    assert sent[f"w{SCALE_SUFFIX}"] is update[f"w{SCALE_SUFFIX}"]  # int8's scales untouched


def test_small_flip_is_the_update_times_minus_three_tenths() -> None:
    update = _update()

    sent = scaled(-0.3)(update)

    for name in ("w", "b"):
        np.testing.assert_allclose(sent[name], -0.3 * update[name], rtol=1e-6)
    assert sent[f"w{SCALE_SUFFIX}"] is update[f"w{SCALE_SUFFIX}"]


def test_every_default_attack_runs_with_the_direction_check_off_and_on() -> None:
    catalogue = attacks("trimmed-mean")

    for label in DEFAULT_ATTACKS:
        assert not catalogue[label].direction
        assert catalogue[label + DEFENDED].direction
    assert catalogue["collude"].nodes == 2
    assert catalogue["honest"].tamper is None


def test_the_colluder_is_the_source_after_the_culprit_in_sorted_order() -> None:
    names = ["synth-latin", "python-stdlib", "synth-greek", "synth-cyrillic"]

    assert culprits(names, "synth-cyrillic", 2) == ["synth-cyrillic", "synth-greek"]
    assert culprits(names, "synth-latin", 2) == ["synth-latin", "python-stdlib"]  # wraps
    with pytest.raises(SystemExit, match="not a source"):
        culprits(names, "de-novels", 1)


def test_head_and_tail_read_different_files(tmp_path: Path) -> None:
    corpus = SourceSpec(name="de-novels", path=str(tmp_path), vocab_size=4096)

    head, tail = head_and_tail(corpus)

    assert (head.name, tail.name) == ("de-novels-head", "de-novels-tail")
    assert (head.path, tail.path) == (str(tmp_path / "train.txt"), str(tmp_path / "val.txt"))
    assert head.vocab_size == tail.vocab_size == 4096


def test_a_change_compares_the_same_honest_sources() -> None:
    honest = {"culprits": [], "sources": {"a": 1.0, "b": 2.0, "c": 9.0}}
    attacked = {"culprits": ["c"], "sources": {"a": 1.1, "b": 2.2, "c": 3.0}}

    assert change(attacked, honest) == pytest.approx(10.0)  # a and b only, in both runs
    assert np.isnan(change(attacked, None))


@pytest.mark.slow
def test_a_scaled_update_is_caught_and_named(tmp_path: Path, node_cache: Path) -> None:
    out = tmp_path / "out"
    share_cache(tmp_path / "state", node_cache)  # the benchmark's state-dir: --work/state
    labels = "honest,honest+direction,x1e6,x1e6/reject+direction"
    argv = ["--quick", "--attacks", labels, "--out", str(out), "--work", str(tmp_path)]

    assert main(argv) == 0

    result = json.loads((out / "4-sources" / "poisoning.json").read_text())
    honest, honest_on, clipped, rejected = result["runs"]
    assert honest["named"] == {} and honest["other_problems"] == 0
    assert honest_on["honest_named"] == [] and honest_on["sources"] == honest["sources"]
    assert honest_on["agreement"] and not honest["agreement"]
    for run in (clipped, rejected):
        assert run["named"]["synth-greek"]["rounds"] == [1, 2]
        assert run["named"]["synth-greek"]["checks"] == ["size"]
    assert "beyond what this round's local training" in clipped["named"]["synth-greek"]["reason"]
    assert clipped["tokens_credited"] == {"synth-greek": 8192}
    assert rejected["tokens_credited"] == {"synth-greek": 0}
    assert result["defence_change_percent"] == 0.0
    assert result["every_defended_culprit_named"] is True
