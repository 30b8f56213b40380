"""A source's round under ``embedding-rows``: which φ rows it saw, and what its reply carries."""

from pathlib import Path

import numpy as np
import pytest
import torch

from dept.config import load_config
from dept.data.sources import load_sources
from dept.data.token_stream import StreamPosition, training_batches
from dept.model.build import build_model
from dept.model.roles import body_state, embedding_parameters
from dept.model.variants import variant
from dept.state.workspace import Workspace
from dept.train.seen_rows import SeenTokens, row_update_sizes, sent_rows
from dept.train.source_client import SourceClient
from dept.wire import keys
from dept.wire.compression import decode, payload_keys
from tests.helpers import debug_run_config, share_cache

ROWS = 600  # the global vocabulary: φ's rows


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path: Path, node_cache: Path) -> None:
    share_cache(tmp_path / "state", node_cache)


def _client(tmp_path: Path, name: str, **overrides: object) -> SourceClient:
    cfg = load_config(debug_run_config(tmp_path, **{"global-vocab-size": ROWS, **overrides}))
    specs = [s for s in load_sources(None) if s.name.startswith("synth")]
    spec = next(s for s in specs if s.name == name)
    return SourceClient(cfg, spec, Workspace(tmp_path / "state", "run1", spec.name), specs)


def _arrays(client: SourceClient) -> dict[str, torch.Tensor]:
    """What the server sends: θ, and φ whole (GLOB) or its V_k rows (TRIM)."""
    model = build_model("debug", ROWS, 64, seed=0)
    phi = {n: p.detach().clone() for n, p in embedding_parameters(model).items()}
    if client.shared_ids is not None:
        rows = torch.from_numpy(client.shared_ids)
        phi = {n: v[rows] for n, v in phi.items()}
    return body_state(model) | phi


def test_seen_tokens_count_every_batch_handed_out() -> None:
    seen = SeenTokens(6)
    batches = [np.array([[0, 1, 1]]), np.array([[4, 1, 0]])]
    assert [b.tolist() for b in seen.watch(iter(batches))] == [b.tolist() for b in batches]
    assert seen.counts.tolist() == [2, 3, 0, 0, 1, 0]
    assert seen.seen(4).tolist() == [True, True, False, False]


def test_the_rows_sent_follow_the_rule_and_the_variant() -> None:
    seen = SeenTokens(5)
    seen.counts[:] = [3, 0, 2, 0, 7]  # TRIM's local rows: the last is "other", never shared
    vk = np.array([10, 20, 30, 40])
    trim = sent_rows(variant("trim"), "seen", vk, seen)
    assert trim is not None and trim.ids.tolist() == [10, 30] and trim.counts.tolist() == [3, 2]
    everything = sent_rows(variant("trim"), "all", vk, seen)
    assert everything is not None and everything.ids.tolist() == vk.tolist()
    assert everything.counts is None
    glob = sent_rows(variant("glob"), "seen", None, seen)
    assert glob is not None and glob.ids.tolist() == [0, 2, 4] == glob.positions.tolist()
    assert sent_rows(variant("glob"), "all", None, seen) is None, "φ whole"
    assert sent_rows(variant("glob"), "seen-zero-filled", None, seen) is None, "φ whole"
    assert sent_rows(variant("spec"), "seen", vk, seen) is None, "SPEC shares no rows"


def test_the_row_sizes_split_seen_from_unseen() -> None:
    phi = {"input": torch.tensor([[3.0, 4.0], [0.0, 0.0], [1.0, 1.0]])}
    sizes = row_update_sizes(phi, np.array([True, False, True]))
    assert sizes[keys.EMBEDDING_ROWS_SEEN] == 2
    assert sizes[keys.EMBEDDING_UPDATE_SEEN_RMS] == pytest.approx(np.sqrt(27 / 4))
    assert sizes[keys.EMBEDDING_UPDATE_UNSEEN_RMS] == 0.0


@pytest.mark.parametrize("variant_name", ["glob", "trim"])
def test_a_seen_round_sends_exactly_the_rows_its_batches_held(
    tmp_path: Path, variant_name: str
) -> None:
    client = _client(tmp_path, "synth-greek", variant=variant_name, **{"embedding-rows": "seen"})
    arrays = _arrays(client)
    result = client.train_round(arrays, global_step=0, server_round=1)
    ids = result.payload[keys.EMBEDDING_IDS].numpy()
    counts = result.payload[keys.EMBEDDING_COUNTS].numpy()
    # what the round trained on: the source's first local-steps batches, in the run's order
    cfg = client.cfg
    expected = np.zeros(ROWS, np.int64)
    for batch in _batches(client, cfg.local_steps):
        expected += np.bincount(batch.reshape(-1), minlength=ROWS)
    assert ids.tolist() == np.flatnonzero(expected).tolist()
    assert counts.tolist() == expected[ids].tolist()
    assert counts.sum() * cfg.seq_len == result.stats.tokens * (cfg.seq_len + 1)
    held = ROWS if client.shared_ids is None else len(client.shared_ids)
    assert 0 < len(ids) <= held
    positions = ids if client.shared_ids is None else np.searchsorted(client.shared_ids, ids)
    sent = result.payload["input"]
    assert sent.shape == (len(ids), arrays["input"].shape[1])
    assert torch.equal(sent, result.delta["input"][torch.from_numpy(positions)])
    assert result.metrics[keys.EMBEDDING_ROWS_SEEN] == len(ids)
    assert result.metrics[keys.EMBEDDING_UPDATE_UNSEEN_RMS] > 0, "tied: pushed down, not sent"


def _batches(client: SourceClient, steps: int) -> list[np.ndarray]:
    """The global ids of the first ``steps`` batches a fresh source trains on."""
    cfg = client.cfg
    stream = training_batches(
        client.tokens.train, cfg.seq_len, cfg.batch_size, cfg.seed, StreamPosition()
    )
    return [next(stream) for _ in range(steps)]


def test_under_all_every_row_goes_up_and_the_sizes_are_recorded(tmp_path: Path) -> None:
    client = _client(tmp_path, "synth-greek", variant="glob", **{"embedding-rows": "all"})
    result = client.train_round(_arrays(client), global_step=0, server_round=1)
    assert keys.EMBEDDING_IDS not in result.payload and result.payload["input"].shape[0] == ROWS
    seen = result.metrics[keys.EMBEDDING_ROWS_SEEN]
    assert 0 < seen < ROWS
    assert result.metrics[keys.EMBEDDING_UPDATE_SEEN_RMS] > 0
    assert result.metrics[keys.EMBEDDING_UPDATE_UNSEEN_RMS] > 0


def test_zero_filled_sends_every_row_and_zero_where_unseen(tmp_path: Path) -> None:
    client = _client(
        tmp_path, "synth-greek", variant="glob", **{"embedding-rows": "seen-zero-filled"}
    )
    result = client.train_round(_arrays(client), global_step=0, server_round=1)
    sent, moved = result.payload["input"], result.delta["input"]
    unseen = (sent == 0).all(dim=1)
    assert sent.shape[0] == ROWS and keys.EMBEDDING_IDS not in result.payload
    assert unseen.sum() == ROWS - result.metrics[keys.EMBEDDING_ROWS_SEEN]
    assert torch.equal(sent[~unseen], moved[~unseen])
    assert (moved[unseen] != 0).any(), "the local model moved them; the reply says zero"


def test_frozen_unseen_rows_end_the_round_where_it_started_them(tmp_path: Path) -> None:
    client = _client(
        tmp_path,
        "synth-greek",
        variant="glob",
        **{"embedding-rows": "seen", "unseen-rows": "freeze"},
    )
    result = client.train_round(_arrays(client), global_step=0, server_round=1)
    ids = torch.from_numpy(result.payload[keys.EMBEDDING_IDS].numpy().astype(np.int64))
    unseen = torch.ones(ROWS, dtype=torch.bool)
    unseen[ids] = False
    assert (result.delta["input"][unseen] == 0).all()
    assert result.metrics[keys.EMBEDDING_UPDATE_UNSEEN_RMS] == 0.0


def test_the_residual_keeps_unsent_rows_and_owes_nothing_for_them(tmp_path: Path) -> None:
    # Prepare: int8 with error feedback, two rounds of GLOB under seen
    client = _client(
        tmp_path, "synth-greek", variant="glob", compression="int8", **{"embedding-rows": "seen"}
    )
    arrays = _arrays(client)
    # Execute
    first = client.train_round(arrays, global_step=0, server_round=1)
    residual = client.ws.load_state(before_round=2).state.residual
    # Assert: the payload is int8 codes of the seen rows; the residual is whole-φ sized,
    # what the codes lost on the rows sent and zero on the others (their update is dropped)
    ids = first.payload[keys.EMBEDDING_IDS].numpy().astype(np.int64)
    shapes = {n: tuple(v.shape) for n, v in arrays.items()}
    shapes["input"] = (len(ids), shapes["input"][1])
    codes = {k: v for k, v in first.payload.items() if not k.startswith("embedding-")}
    assert codes.keys() == payload_keys(shapes, "int8")
    sent = decode(codes, shapes, "int8")
    at = torch.from_numpy(ids)
    assert residual["input"].shape == (ROWS, shapes["input"][1])
    assert torch.equal(residual["input"][at], first.delta["input"][at] - sent["input"])
    unsent = torch.ones(ROWS, dtype=torch.bool)
    unsent[at] = False
    assert (residual["input"][unsent] == 0).all()
    # the next round adds back only what the rows it sends lost
    second = client.train_round(arrays, global_step=8, server_round=2)
    assert client.ws.load_state(before_round=3).state.residual["input"].shape[0] == ROWS
    assert second.payload["input"].shape[0] == len(second.payload[keys.EMBEDDING_IDS])
