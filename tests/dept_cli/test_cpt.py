"""Continued pre-training on the debug preset: bodies from DEPT and STD adapt to a new source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dept.config import load_config
from dept.data.corpus import load_source_text
from dept.data.sources import load_sources
from dept.data.vocab import load_tokenizer
from dept.model.build import build_model
from dept.model.roles import body_state
from dept.state.workspace import own_tokenizer
from dept.train.baselines import run_standard
from dept_cli import cpt, evaluate, finetune
from tests.dept_cli.test_finetune import write_task
from tests.helpers import debug_run_config, share_cache, synthetic_sources


def test_cpt_starts_from_the_given_body_with_fresh_embeddings(tmp_path: Path) -> None:
    cfg = load_config(debug_run_config(tmp_path))
    spec = next(s for s in load_sources(None) if s.name == "synth-greek")
    cache = tmp_path / "state" / "cache"
    tokenizer = own_tokenizer(spec, load_source_text(spec, cache, 0), cache, 0)
    trained = {k: v + 0.01 for k, v in body_state(build_model("debug", 300, 64)).items()}

    run = run_standard(
        cfg,
        [spec],
        tmp_path / "state",
        temperature=0.0,
        sources_per_round=1,
        body=trained,
        tokenizer_file=tokenizer,
        name="cpt",
    )
    fresh = run_standard(
        cfg,
        [spec],
        tmp_path / "state",
        temperature=0.0,
        sources_per_round=1,
        tokenizer_file=tokenizer,
    )

    assert run.rounds[0].avg_val_bpb != fresh.rounds[0].avg_val_bpb, "the given body was used"
    assert run.rounds[-1].avg_val_bpb < run.rounds[0].avg_val_bpb
    rows = len(load_tokenizer(tokenizer))
    assert run.embedding_params == fresh.embedding_params == rows * 64, "own tokenizer's rows"
    assert not all(torch.equal(run.body[k], trained[k]) for k in trained), "the body trains on"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "variant"),
    [("debug", "spec-opt"), ("gpt2:debug", "glob")],  # GLOB's body carries the shared ψ
)
def test_cpt_benchmark_writes_curves_for_three_bodies(
    tmp_path: Path, node_cache: Path, model: str, variant: str
) -> None:
    sources = synthetic_sources(tmp_path, "latin", "cyrillic", "greek")
    out = tmp_path / "out"
    share_cache(out / "state", node_cache)  # where cpt keeps its nodes' state
    # fmt: off
    assert cpt.main(["--sources-file", str(sources), "--held-out", "synth-greek",
                     "--model", model, "--variant", variant,
                     "--tokens", "8192", "--local-steps", "4",
                     "--cpt-steps", "16", "--eval-every", "8", "--eval-bytes", "2048",
                     "--global-vocab-size", "600", "--out", str(out)]) == 0
    # fmt: on
    curves = json.loads((out / "cpt.json").read_text())["curves"]
    assert len(curves) == 3
    for curve in curves.values():
        assert [step for step, _ in curve] == [0, 8, 16]
        assert curve[-1][1] < curve[0][1]
    assert "synth-greek" in (out / "cpt.md").read_text()
    assert (out / "cpt.png").stat().st_size > 0
    # each adapted model is a folder dept eval scores as the run did, and dept finetune tunes
    assert {p.name for p in (out / "models").iterdir()} == set(map(cpt.model_folder_name, curves))
    name = next(iter(curves))
    adapted = out / "models" / cpt.model_folder_name(name)
    report = evaluate.evaluate(evaluate.parse_args([str(adapted), "--device", "cpu"]))
    (row,) = [r for r in report["results"] if r["task"].startswith("dept_stream_bpb")]
    assert row["bits_per_byte"] == pytest.approx(curves[name][-1][1], rel=0.01)
    task = write_task(
        tmp_path / "task",
        *[[{"sentence": f"{w} {i}", "label": i % 2} for i, w in enumerate(["α", "b"] * 8)]] * 2,
    )
    tuned = finetune.run(
        finetune.parse_args([str(adapted), "--task", str(task), "--seeds", "1", "--epochs", "1"])
    )
    assert tuned["results"][0]["model"] == adapted.name
