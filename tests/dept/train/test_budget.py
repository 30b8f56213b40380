"""Sizes that cannot fit the machine, or rounds that cannot finish in time, stop the run
before any work with the key named."""

from pathlib import Path

import pytest
import torch
from transformers import GPT2Config

from dept.config import ConfigError, load_config
from dept.data.sources import parse_source, run_sources
from dept.model.build import build_model
from dept.model.families import FAMILIES, model_width, position_count
from dept.model.roles import body_parameters, body_state, position_parameters
from dept.train.budget import Device, body_params, check_client_fits, check_server_fits
from server_app import sizing
from tests.helpers import debug_run_config

LAPTOP = Device("cpu", memory=16e9, peak_flops=4 * 2.5e11)


def test_body_params_count_the_real_body() -> None:
    assert body_params("tiny") == sum(
        t.numel() for t in body_state(build_model("tiny", 300, 8)).values()
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_presets_formulas_count_the_model_it_builds(family: str) -> None:
    for size in FAMILIES[family].sizes:
        name = f"{family}:{size}"
        with torch.device("meta"):
            built = build_model(name, 300, 8)
        counted = sum(p.numel() for p in body_parameters(built).values())
        assert body_params(name) == counted, size
        assert model_width(name) == built.get_input_embeddings().embedding_dim, size
        positions = sum(p.numel() for p in position_parameters(built).values())
        assert position_count(name, 8) == positions, size


def test_a_config_files_body_is_counted_on_the_model_it_builds(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "gpt2", "n_embd": 48, "n_layer": 3, "n_head": 4}')
    built = build_model(str(config), 300, 8)
    assert body_params(str(config)) == sum(t.numel() for t in body_state(built).values())


def test_a_vocabulary_too_large_for_the_machine_names_its_key(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path, **{"model": "tiny", "variant": "glob"}))
    with pytest.raises(
        ConfigError, match=r"config key 'global-vocab-size' \(1,000,000\): a client"
    ):
        check_client_fits(
            cfg, 1_000_000, "config key 'global-vocab-size'", Device("cpu", 4e9, 1e12)
        )
    with pytest.raises(
        ConfigError, match=r"config key 'global-vocab-size' \(1,000,000\): the server"
    ):
        check_server_fits(cfg, 1_000_000, memory=1e9)
    check_client_fits(cfg, 4096, "config key 'global-vocab-size'", LAPTOP)
    check_server_fits(cfg, 4096, memory=LAPTOP.memory)


def test_a_round_that_cannot_finish_before_its_timeout_names_the_key(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path, **{"grad-accum-steps": 100_000}))
    with pytest.raises(
        ConfigError,
        match=r"config key 'grad-accum-steps' \(100,000\): a round trains .*'round-timeout-s'",
    ):
        check_client_fits(cfg, 300, "config key 'global-vocab-size'", LAPTOP)


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("global-vocab-size", 10_000_000, r"'global-vocab-size' must be in \[300, 1,048,576\]"),
        ("outer-lr", 1e6, r"'outer-lr' \(1e\+06\) must be <= 2 with outer-optimizer 'fedavg'"),
    ],
)
def test_sizes_no_machine_serves_are_refused_by_the_schema(
    tmp_path: Path, key: str, value: float, why: str
) -> None:
    with pytest.raises(ConfigError, match=why):
        load_config(debug_run_config(tmp_path, **{key: value}))
    with pytest.raises(ConfigError, match=r"'vocab-size' must be in \[258, 1,048,576\]"):
        parse_source(
            {"name": "x", "path": "builtin:synthetic-latin", "vocab-size": 10**7}, tmp_path
        )


@pytest.mark.parametrize(("variant", "server_holds_them"), [("glob", True), ("spec-opt", False)])
def test_learned_positions_count_where_they_are_held(
    tmp_path: Path, variant: str, server_holds_them: bool
) -> None:
    # A config.json whose context is far longer than the run needs: ψ alone is 6.4M x 256
    # (26 GB with AdamW).
    config = GPT2Config(n_embd=256, n_layer=1, n_head=4, n_positions=6_400_000)
    (tmp_path / "long.json").write_text(config.to_json_string())
    cfg = load_config(
        debug_run_config(tmp_path, model=str(tmp_path / "long.json"), variant=variant)
    )
    with pytest.raises(ConfigError, match=r"config key 'model' .*: a client needs"):
        check_client_fits(cfg, 4096, "config key 'global-vocab-size'", LAPTOP)
    if server_holds_them:
        with pytest.raises(ConfigError, match="the server needs"):
            check_server_fits(cfg, 4096, memory=LAPTOP.memory)
    else:
        check_server_fits(cfg, 0, memory=LAPTOP.memory)


def test_a_simulation_on_the_cpu_counts_the_server_beside_its_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1.3b at one micro-batch: a client (19.8 GB) fits 25 GB alone, not beside the server."""
    machine = Device("cpu", memory=25e9, peak_flops=1e15)
    monkeypatch.setattr(Device, "here", classmethod(lambda cls, kind, cpu_threads=0: machine))
    cfg = load_config(
        debug_run_config(
            tmp_path,
            **{"model": "1.3b", "seq-len": 64, "batch-size": 1, "local-steps": 1},
            **{"num-server-rounds": 1, "variant": "spec-opt", "round-timeout-s": 1e9},
        )
    )
    check_client_fits(cfg, 4096, "source 'python' key 'vocab-size'", machine)
    with pytest.raises(ConfigError, match=r"left beside the server's \d+\.\d GB$"):
        sizing.check_fits_here(cfg, run_sources(cfg))
