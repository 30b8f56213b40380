"""Export round trip: a finished run's models load with transformers offline and generate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from client_app.app import app as client_app
from dept.config import ConfigError
from dept.export import export_global, export_source, load_run, main
from dept.files import new_file_mode
from dept.source_client import SourceClient
from dept.sources import run_sources
from dept.workspace import Workspace
from server_app.federation import run_federation
from server_app.local_grid import LocalGrid
from tests.helpers import DEVICES, debug_run_config, synthetic_sources


def _finished_run(
    tmp_path: Path, cache: Path, variant: str, model: str = "debug", device: str = "cpu"
) -> Path:
    sources = synthetic_sources(tmp_path, "latin", "greek")
    config = debug_run_config(
        tmp_path,
        cache,
        variant=variant,
        model=model,
        device=device,
        **{"sources-file": str(sources), "num-server-rounds": 1, "global-vocab-size": 600},
    )
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    return run_federation(LocalGrid(client_app, nodes, config), config).out_dir


def _generate(folder: Path, prompt: str) -> str:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert out.shape[1] > ids.shape[1]
    return tokenizer.decode(out[0, ids.shape[1] :])


@pytest.mark.parametrize("device", DEVICES)  # where the run trained; the export is on the CPU
def test_spec_source_export_matches_the_trained_model_and_generates(
    tmp_path: Path, node_cache: Path, device: str
) -> None:
    run_dir = _finished_run(tmp_path, node_cache, "spec", device=device)
    out = tmp_path / "greek"

    assert main([str(run_dir), "--source", "synth-greek", "--out", str(out)]) == 0

    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert isinstance(_generate(out, "α"), str)
    # The exported model scores V_k exactly as the source's own model does (both on the CPU:
    # load_run builds there, so CPU token ids feed a CPU model).
    run = load_run(run_dir)
    spec = next(s for s in run_sources(run.cfg) if s.name == "synth-greek")
    client = SourceClient(
        run.cfg, spec, Workspace(tmp_path / "state", run.run_id, spec.name), run_sources(run.cfg)
    )
    assert client.vocab_map is not None
    local = client.model(run.body, client.ws.load_state(before_round=2).state).eval()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    kept = client.vocab_map.kept_ids
    tokens = torch.from_numpy(client.tokens.validation[:32].astype(np.int64))[None]
    with torch.no_grad():
        want = local(torch.from_numpy(client.vocab_map.to_local(tokens.numpy()))).logits
        want = want[..., : len(kept)]
        got = exported(tokens).logits[..., torch.from_numpy(kept)]
    assert torch.allclose(got, want, atol=1e-5)
    suppressed = set(exported.generation_config.suppress_tokens)
    assert suppressed == set(range(len(client.tokenizer))) - set(kept.tolist())


def test_a_cuda_run_exports_on_a_machine_without_cuda(tmp_path: Path, node_cache: Path) -> None:
    run_dir = _finished_run(tmp_path, node_cache, "spec-opt")
    config = run_dir / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "device": "cuda"}))

    out = export_source(run_dir, "synth-latin", tmp_path / "latin")

    assert isinstance(_generate(out, "a"), str)


def test_glob_exports_each_source_and_the_global_model(tmp_path: Path, node_cache: Path) -> None:
    run_dir = _finished_run(tmp_path, node_cache, "glob")
    export_source(run_dir, "synth-latin", tmp_path / "latin")
    export_global(run_dir, tmp_path / "global")
    for folder in ("latin", "global"):
        assert isinstance(_generate(tmp_path / folder, "a"), str)


def test_export_errors_name_the_problem(tmp_path: Path, node_cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json is missing"):
        export_source(tmp_path, "x", tmp_path / "out")
    run_dir = _finished_run(tmp_path, node_cache, "spec-opt")
    with pytest.raises(ConfigError, match="'nope' is not in the run's sources"):
        export_source(run_dir, "nope", tmp_path / "model")
    with pytest.raises(ConfigError, match="only glob and trim"):
        export_global(run_dir, tmp_path / "model")
    assert isinstance(_generate(export_source(run_dir, "synth-latin", tmp_path / "l"), "a"), str)


def test_export_replaces_an_earlier_one_only_with_force(
    tmp_path: Path, node_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _finished_run(tmp_path, node_cache, "spec-opt")
    out = tmp_path / "latin"
    args = [str(run_dir), "--source", "synth-latin", "--out", str(out)]
    assert main(args) == 0
    (out / "stale.bin").write_text("from an earlier export")
    capsys.readouterr()

    with pytest.raises(SystemExit) as refused:
        main(args)

    assert refused.value.code == 2
    error = f"dept export: refusing to overwrite {out} (pass --force to replace it)\n"
    assert capsys.readouterr().err == error
    assert (out / "stale.bin").is_file(), "nothing touched"
    assert main([*args, "--force"]) == 0
    assert not (out / "stale.bin").exists() and (out / "model.safetensors").is_file()
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert set(modes.values()) == {new_file_mode(tmp_path)}, modes
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("not a model")
    for mistaken in (notes, run_dir):  # run_dir has a config.json, but it is no model
        with pytest.raises(FileExistsError, match="even with --force: it is not an exported"):
            export_source(run_dir, "synth-latin", mistaken, force=True)
    assert (run_dir / "summary.json").is_file()


@pytest.mark.parametrize("variant", ["spec-opt", "glob"])
def test_a_gpt2_source_exports_with_its_positions(
    tmp_path: Path, node_cache: Path, variant: str
) -> None:
    run_dir = _finished_run(tmp_path, node_cache, variant, model="gpt2:debug")
    out = export_source(run_dir, "synth-latin", tmp_path / "latin")

    run = load_run(run_dir)
    spec = next(s for s in run_sources(run.cfg) if s.name == "synth-latin")
    client = SourceClient(
        run.cfg, spec, Workspace(tmp_path / "state", run.run_id, spec.name), run_sources(run.cfg)
    )
    arrays = {**run.body, **run.embeddings}
    local = client.model(arrays, client.ws.load_state(before_round=2).state).eval()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = torch.from_numpy(client.tokens.validation[:32].astype(np.int64))[None]
    with torch.no_grad():
        assert torch.allclose(exported(tokens).logits, local(tokens).logits, atol=1e-5)
    assert exported.config.model_type == "gpt2"
    ids = AutoTokenizer.from_pretrained(out)("a b", return_tensors="pt").input_ids
    assert exported.generate(ids).shape[1] <= 64, "the saved settings stay within ψ's rows"
    assert "gpt2" in (out / "README.md").read_text()
    if variant == "glob":
        assert isinstance(_generate(export_global(run_dir, tmp_path / "global"), "a"), str)
