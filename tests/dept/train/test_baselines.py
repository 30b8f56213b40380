"""STD and ACT: temperature sampling, stratified batches, active forgetting and its period,
and a short run on built-in data."""

from pathlib import Path

import numpy as np
import pytest
import torch

from dept.config import DeptConfig, load_config
from dept.data.sources import load_sources
from dept.data.token_stream import StreamPosition, training_batches
from dept.model.build import build_model
from dept.model.roles import body_state, embedding_parameters
from dept.train import baselines
from dept.train.baselines import (
    Forgetting,
    mixture_batches,
    reset_embeddings,
    run_standard,
    stratified_batches,
    temperature_probs,
)
from dept.train.local import make_inner_optimizer, next_token_loss
from tests.helpers import debug_run_config

SIZES = [1000, 4000, 16000]


@pytest.mark.parametrize(
    ("tau", "expected"),
    [(0.0, [1 / 3] * 3), (1.0, [1 / 21, 4 / 21, 16 / 21]), (0.5, [1 / 7, 2 / 7, 4 / 7])],
)
def test_temperature_probabilities(tau: float, expected: list[float]) -> None:
    assert np.allclose(temperature_probs(SIZES, tau), expected)


def test_temperature_between_uniform_and_proportional() -> None:
    uniform, mid, proportional = (temperature_probs(SIZES, t)[-1] for t in (0, 0.3, 1))
    assert uniform < mid < proportional


def test_mixture_batches_draw_sources_in_proportion() -> None:
    streams = [np.full(n, k, dtype=np.int32) for k, n in enumerate(SIZES)]
    probs = temperature_probs(SIZES, 0.3)
    batches = mixture_batches(streams, probs, seq_len=8, batch_size=50, seed=0)
    rows = np.concatenate([next(batches)[:, 0] for _ in range(80)])  # 4000 sequences
    observed = np.bincount(rows, minlength=3) / len(rows)
    assert np.allclose(observed, probs, atol=0.025)
    batch = next(batches)
    assert (batch == batch[:, :1]).all(), "each row comes whole from one source"


def test_temperature_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="temperature"):
        temperature_probs(SIZES, -1)
    with pytest.raises(ValueError, match="training tokens"):
        temperature_probs([10, 0], 1)


def test_active_forgetting_resets_embeddings_and_their_optimizer_state() -> None:
    model = build_model("debug", 50, 16)
    optimizer = make_inner_optimizer(model, load_config({"model": "debug"}))
    next_token_loss(model, torch.randint(0, 50, (2, 17))).backward()
    optimizer.step()
    phi = embedding_parameters(model)["input"]
    before, body = phi.detach().clone(), body_state(model)

    reset_embeddings(model, optimizer, torch.Generator().manual_seed(1))

    assert not torch.allclose(phi, before)
    assert phi.std().item() == pytest.approx(0.02, rel=0.2)
    assert phi not in optimizer.state, "Adam moments of the old φ are dropped"
    assert all(torch.equal(v, body_state(model)[k]) for k, v in body.items()), "θ is kept"


@pytest.mark.parametrize("forget", [False, True])
def test_standard_training_lowers_bpb_on_every_source(tmp_path: Path, forget: bool) -> None:
    cfg = load_config(debug_run_config(tmp_path, **{"global-vocab-size": 600}))
    specs = [s for s in load_sources(None) if s.name.startswith("synth")][:2]
    rounds: list[int] = []

    run = run_standard(
        cfg,
        specs,
        tmp_path / "state",
        temperature=0.3,
        sources_per_round=2,
        forgets=forget,
        on_round=lambda r: rounds.append(r.round),
    )

    assert rounds == list(range(1, cfg.num_server_rounds + 1))
    assert run.tokens_trained == cfg.total_steps * 2 * cfg.batch_size * cfg.seq_len
    first, last = run.rounds[0], run.rounds[-1]
    assert set(last.eval) == {s.name for s in specs}
    assert last.avg_val_bpb < first.avg_val_bpb
    assert run.embedding_params == 600 * 64


def test_stratified_batches_take_each_sources_client_stream_in_order() -> None:
    streams = [
        np.full(400, k, dtype=np.int32) + np.arange(400, dtype=np.int32) % 7 for k in (0, 10)
    ]
    clients = [training_batches(t, 8, 3, 5, StreamPosition()) for t in streams]

    batches = stratified_batches(streams, seq_len=8, batch_size=3, seed=5)

    for _ in range(4):
        assert np.array_equal(next(batches), np.concatenate([next(c) for c in clients]))


def test_stratified_std_refuses_a_temperature(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path, **{"global-vocab-size": 600}))
    specs = [s for s in load_sources(None) if s.name.startswith("synth")][:2]

    with pytest.raises(ValueError, match="stratified batches are τ = 0"):
        run_standard(cfg, specs, tmp_path / "state", temperature=0.3, sources_per_round=2,
                     stratified=True)  # fmt: skip


@pytest.mark.parametrize(
    ("period", "resets"), [(0, [4, 8]), (3, [3, 6, 9]), (2, [2, 4, 6, 8, 10]), (12, [])]
)
def test_act_forgets_every_period_but_never_at_the_end(period: int, resets: list[int]) -> None:
    cfg = load_config({"model": "debug", "local-steps": 4, "num-server-rounds": 3,
                       "act-period": period})  # fmt: skip
    model = build_model("debug", 50, 16)
    forgetting = Forgetting(model, make_inner_optimizer(model, cfg), cfg)
    at_round_end: list[int] = []

    for end in range(4, 13, 4):
        for step in range(end - 3, end + 1):
            forgetting.within_round(step)
        assert end not in forgetting.resets, "a round is evaluated before its reset"
        forgetting.at_round_end(end)
        at_round_end += [end] if end in forgetting.resets else []

    assert forgetting.resets == resets
    assert at_round_end == [s for s in resets if s % 4 == 0]


def test_act_period_reaches_run_standard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Forgetting] = []

    class Recorded(Forgetting):
        def __init__(self, *args: object) -> None:
            super().__init__(*args)  # type: ignore[arg-type]
            made.append(self)

    monkeypatch.setattr(baselines, "Forgetting", Recorded)
    cfg: DeptConfig = load_config(
        debug_run_config(tmp_path, **{"global-vocab-size": 600, "act-period": 5})
    )
    specs = [s for s in load_sources(None) if s.name.startswith("synth")][:2]

    run_standard(cfg, specs, tmp_path / "state", temperature=0.3, sources_per_round=2,
                 forgets=True)  # fmt: skip

    assert [f.resets for f in made] == [[5, 10, 15]], "2 rounds of 8 steps: never at 16"
