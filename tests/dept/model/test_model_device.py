"""A model is built on the device it trains on, with the CPU's seeded θ unchanged."""

from pathlib import Path

import pytest
import torch

from dept.config import load_config
from dept.data.sources import load_sources
from dept.model.build import build_model
from dept.model.roles import body_parameters
from dept.state.workspace import Workspace
from dept.train.source_client import SourceClient
from tests.helpers import debug_run_config, share_cache

# θ of build_model("debug", 300, 64, seed=0) as it was drawn when models were built on the CPU
# and moved (a float's last bits may differ between CPUs' vector units, hence the tolerance).
SEEDED = {
    "model.layers.0.mlp.down_proj.weight": [-0.0225167964, -0.0230472032, -0.0050115716],
    "model.layers.0.mlp.gate_proj.weight": [0.0053031454, -0.0158162471, 0.0196161065],
}
SEEDED_LAST = (
    "model.layers.1.self_attn.v_proj.weight",
    [-0.0028166573, 0.0198465288, 0.0151195480],
)
SEEDED_SUM = 315.3154378516762  # of every θ value, in float64


def test_the_seeded_cpu_init_is_what_it_was() -> None:
    body = body_parameters(build_model("debug", 300, 64, seed=0, device="cpu"))

    for name, first in SEEDED.items():
        assert body[name].detach().flatten()[:3].tolist() == pytest.approx(first, abs=1e-8)
    name, last = SEEDED_LAST
    assert body[name].detach().flatten()[-3:].tolist() == pytest.approx(last, abs=1e-8)
    total = sum(float(p.detach().double().sum()) for p in body.values())
    assert total == pytest.approx(SEEDED_SUM, abs=1e-5)


def test_a_model_is_built_on_its_device_and_leaves_the_rng_alone() -> None:
    before = torch.random.get_rng_state()

    model = build_model("gpt2:debug", 300, 64, seed=3, device="meta")  # no memory anywhere

    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}
    assert torch.equal(torch.random.get_rng_state(), before)


def test_a_source_builds_its_model_on_its_device(
    tmp_path: Path, node_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(debug_run_config(tmp_path, variant="spec-opt"))
    spec = next(s for s in load_sources(None) if s.name == "synth-latin")
    share_cache(tmp_path / "state", node_cache)
    client = SourceClient(cfg, spec, Workspace(tmp_path / "state", "run", spec.name))
    built_on = []

    def record(*args: object, **kwargs: object) -> torch.nn.Module:
        built_on.append(kwargs["device"])
        return build_model(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("dept.train.source_client.build_model", record)
    body = {n: p.detach() for n, p in body_parameters(build_model("debug", 50, 64)).items()}
    model = client.model(body, None)

    assert built_on == [torch.device("cpu")] and model.device == torch.device("cpu")
