"""``dept models``: every preset of every family, counted as the model a run builds."""

from __future__ import annotations

import json

import pytest

from dept.model import FAMILIES, body_parameters, build_model, count_params, position_parameters
from dept_cli.main import main


def models_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["models", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_lists_every_size_of_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    listed = models_json(capsys, "--seq-len", "64")

    expected = [f"{f.name}:{size}" for f in FAMILIES.values() for size in f.sizes]
    assert [row["model"] for row in listed["models"]] == expected
    assert listed["seq_len"] == 64 and listed["tie_embeddings"] is True
    rows = {row["model"]: row for row in listed["models"]}
    for name in ("llama:debug", "gpt2:debug"):
        model = build_model(name, 300, 64)
        assert rows[name]["body_params"] == count_params(body_parameters(model)), name
        assert rows[name]["position_params"] == count_params(position_parameters(model)), name
    assert rows["llama:debug"]["position_params"] == 0, "RoPE: no ψ"


def test_untied_embeddings_double_the_parameters_per_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tied = models_json(capsys)["models"]
    untied = models_json(capsys, "--untied")["models"]

    assert [r["params_per_token"] * 2 for r in tied] == [r["params_per_token"] for r in untied]
    assert [r["body_params"] for r in tied] == [r["body_params"] for r in untied]


def test_the_table_says_how_to_name_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "llama:tiny" in out and "gpt2:125m" in out
    assert "<family>:<size>" in out and "config.json" in out
