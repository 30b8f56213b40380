"""What travels and what stays, per variant, for a model with learned positions (GPT-2)."""

from __future__ import annotations

import pytest

from dept.config import load_config
from dept.model.build import build_model
from dept.model.roles import body_parameters, embedding_parameters, position_parameters
from dept.model.variants import VARIANTS
from dept.train.sharing import initial_tensors, own_parameters, shared_parameters

# variant -> (ψ shared, φ shared, φ kept on the node)
EXPECTED = {
    "glob": (True, True, False),
    "trim": (True, True, True),
    "spec": (False, False, True),
    "spec-opt": (False, False, True),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_positions_are_shared_by_glob_and_trim_and_kept_by_spec(name: str) -> None:
    model = build_model("gpt2:debug", 300, 32, tie_embeddings=False)
    v = VARIANTS[name]
    shared, own = shared_parameters(model, v), own_parameters(model, v)
    positions_shared, phi_shared, phi_kept = EXPECTED[name]

    assert ("positions" in shared) is positions_shared
    assert ("positions" in own) is not positions_shared
    assert ({"input", "output"} <= shared.keys()) is phi_shared
    assert ({"input", "output"} <= own.keys()) is phi_kept
    assert body_parameters(model).keys() <= shared.keys()
    everything = {**body_parameters(model), **embedding_parameters(model)}
    everything |= position_parameters(model)
    assert shared.keys() | own.keys() == everything.keys()


@pytest.mark.parametrize(("name", "with_positions"), [("glob", True), ("spec-opt", False)])
def test_the_server_holds_positions_only_where_they_are_shared(
    name: str, with_positions: bool
) -> None:
    cfg = load_config({"model": "gpt2:debug", "variant": name, "seq-len": 32})
    tensors, embedding_names = initial_tensors(cfg)
    assert ("positions" in tensors) is with_positions
    assert tensors.get("positions", None) is None or tensors["positions"].shape == (32, 64)
    assert set(embedding_names) == ({"input"} if name == "glob" else set())
