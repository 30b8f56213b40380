"""``dept models``: every preset of every family, counted as the model a run builds."""

from __future__ import annotations

import json

import pytest

from dept.model import families as dm
from dept.model import roles
from dept.model.build import build_model
from dept_cli.main import main
from dept_cli.models import EXAMPLES


def models_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["models", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_lists_every_size_of_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    listed = models_json(capsys, "--seq-len", "64", "--vocab-size", "300")

    expected = [f"{f.name}:{size}" for f in dm.FAMILIES.values() for size in f.sizes]
    assert [row["model"] for row in listed["models"]] == expected
    assert listed["seq_len"] == 64 and listed["vocab_size"] == 300
    assert listed["tie_embeddings"] is True
    rows = {row["model"]: row for row in listed["models"]}
    for name in ("llama:debug", "gpt2:debug"):
        model = build_model(name, 300, 64)
        parts = (roles.body_parameters, roles.position_parameters, roles.embedding_parameters)
        counted = [rows[name][k] for k in ("body_params", "position_params", "embedding_params")]
        assert counted == [roles.count_params(part(model)) for part in parts], name
        assert rows[name]["total_params"] == sum(p.numel() for p in model.parameters()), name
    assert rows["llama:debug"]["position_params"] == 0, "RoPE: no ψ"


def test_paper_sizes_at_the_papers_context_and_vocabulary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    listed = models_json(capsys, "--seq-len", "2048", "--vocab-size", "50368")

    rows = {row["model"]: row for row in listed["models"]}
    for family in dm.FAMILIES:
        assert 1.2e9 <= rows[f"{family}:1.3b"]["body_params"] <= 1.4e9, family
        assert 290e6 <= rows[f"{family}:350m"]["body_params"] <= 320e6, family
        assert rows[f"{family}:1.3b"]["embedding_params"] == 50_368 * 2048, family
    assert rows["gpt2:1.3b"]["position_params"] == 2048 * 2048


def test_untied_embeddings_double_the_parameters_per_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tied = models_json(capsys)["models"]
    untied = models_json(capsys, "--untied")["models"]

    assert [r["params_per_token"] * 2 for r in tied] == [r["params_per_token"] for r in untied]
    assert [r["embedding_params"] * 2 for r in tied] == [r["embedding_params"] for r in untied]
    assert [r["body_params"] for r in tied] == [r["body_params"] for r in untied]


def test_the_table_says_how_to_name_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--seq-len", "2048"]) == 0
    out = capsys.readouterr().out
    assert "llama:tiny" in out and "gpt2:1.3b" in out
    assert "1,233.23" in out, "llama:1.3b's body, in millions"
    assert "<family>:<size>" in out and "config.json" in out


def test_every_example_of_the_help_runs_as_printed(capsys: pytest.CaptureFixture[str]) -> None:
    commands = [line.split("#")[0].split() for line in EXAMPLES.splitlines()[1:]]

    for command in commands:
        assert command[:2] == ["dept", "models"]
        assert main(command[1:]) == 0, command
        assert "llama:debug" in capsys.readouterr().out, command
