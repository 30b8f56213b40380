"""A GPT-2 (learned positions ψ) federation through the real ServerApp and ClientApp code:
SPEC-OPT keeps each source's ψ_k on its node, GLOB shares and aggregates ψ; both learn."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
from flwr.app import Message
from safetensors.torch import load_file

from client_app.app import app as client_app
from dept.model.build import build_model
from dept.model.families import position_count
from dept.model.roles import body_state
from dept.wire import keys
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.helpers import debug_run_config, synthetic_sources


class SentKeys(LocalGrid):
    """Keeps the array names of every training message, to check what travels."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[set[str]] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        self.sent += [
            set(m.content.array_records[keys.ARRAYS].keys())
            for m in messages
            if m.metadata.message_type == "train"
        ]
        return super().push_messages(messages)


def _run(tmp_path: Path, cache: Path, variant: str) -> tuple[Path, dict, SentKeys]:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    config = debug_run_config(
        tmp_path,
        cache,
        model="gpt2:debug",
        variant=variant,
        **{"sources-file": str(sources), "global-vocab-size": 600},
    )
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    grid = SentKeys(client_app, nodes, config)
    result = run_federation(grid, config)
    return result.out_dir, result.summary, grid


def _learned(summary: dict) -> None:
    assert summary["avg_val_bpb"] < summary["initial_avg_val_bpb"]
    for name, source in summary["sources"].items():
        assert source["val_bpb"] < source["initial_val_bpb"], name


def test_gpt2_spec_opt_keeps_each_sources_positions_home(tmp_path: Path, node_cache: Path) -> None:
    out, summary, grid = _run(tmp_path, node_cache, "spec-opt")

    _learned(summary)
    body = set(body_state(build_model("gpt2:debug", 300, 64)))
    assert grid.sent and all(sent == body for sent in grid.sent), "θ only travels"
    assert set(load_file(str(out / "body.safetensors"))) == body
    [run_dir] = (tmp_path / "state" / "runs").iterdir()
    for name in summary["sources"]:
        kept = load_file(str(run_dir / name / "round-0002" / "embeddings.safetensors"))
        assert kept["positions"].shape == (64, 64), name
    psi = position_count("gpt2:debug", 64)
    assert summary["positions"] == {"params": psi, "where": "each source"}
    assert all(s["embedding_params"] > psi for s in summary["sources"].values())


def test_gpt2_glob_shares_and_aggregates_positions(tmp_path: Path, node_cache: Path) -> None:
    out, summary, grid = _run(tmp_path, node_cache, "glob")

    _learned(summary)
    body = set(body_state(build_model("gpt2:debug", 300, 64)))
    assert grid.sent and all(sent == body | {"positions", "input"} for sent in grid.sent)
    final = load_file(str(out / "body.safetensors"))
    assert set(final) == body | {"positions"}
    assert summary["positions"] == {"params": position_count("gpt2:debug", 64), "where": "shared"}
    assert summary["body_params"] == sum(final[n].numel() for n in body)


@pytest.mark.parametrize("variant", ["trim", "spec"])
def test_gpt2_trim_and_spec_learn_too(tmp_path: Path, node_cache: Path, variant: str) -> None:
    _learned(_run(tmp_path, node_cache, variant)[1])
