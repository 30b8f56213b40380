"""Export round trip: a finished run's models load with transformers offline, generate, and
score what the run measured."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from client_app.app import app as client_app
from dept.config import ConfigError
from dept.data.sources import run_sources
from dept.data.vocab import token_byte_lengths
from dept.export import export_global, export_source, load_run
from dept.state.files import new_file_mode
from dept.state.workspace import Workspace
from dept.train.evaluate import byte_prefix
from dept.train.prepare import prepare_source
from dept.train.source_client import SourceClient
from dept_cli.export import main
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
        **{
            "sources-file": str(sources),
            "num-server-rounds": 1,
            "global-vocab-size": 600,
            "eval-bytes": 2048,  # text enough to compare the scores on, scored quickly
        },
    )
    nodes = [{"partition-id": i, "num-partitions": 2} for i in range(2)]
    return run_federation(LocalGrid(client_app, nodes, config), config).out_dir


SOURCES = ("synth-latin", "synth-greek")
MODELS = ("debug", "gpt2:debug")  # Llama, GPT-2
# The export's softmax over the whole tokenizer, one window at a time, against the run's
# over |V_k| + 1 rows in batches: the same float32 numbers summed in other orders and matrix
# shapes. Measured at most 6e-8 relative over the 16 sources here; the bug was 1e-1.
SAME_BPB = 1e-6


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, node_cache: Path) -> Callable[..., Path]:
    """A finished run of a variant and model, trained the first time a test asks for it:
    several tests read each one, and none changes it."""
    done: dict[tuple[str, str], Path] = {}

    def run(variant: str, model: str = "debug") -> Path:
        if (variant, model) not in done:
            folder = tmp_path_factory.mktemp(f"{variant}-{model.replace(':', '-')}")
            done[variant, model] = _finished_run(folder, node_cache, variant, model)
        return done[variant, model]

    return run


def _validation(run_dir: Path, source: str) -> np.ndarray:
    """The token stream the run scored ``source`` on: its validation split, from the run's
    own cache."""
    run = load_run(run_dir)
    specs = run_sources(run.cfg)
    spec = next(s for s in specs if s.name == source)
    cache = Path(run.cfg.state_dir) / "cache"
    return prepare_source(run.cfg, spec, cache, specs).tokens.validation


def _stock_bpb(folder: Path, tokens: np.ndarray, seq_len: int, max_bytes: int) -> float:
    """Bits per byte of an exported folder on ``tokens`` by stock transformers: the model's
    plain softmax over its tokenizer, on the windows dept.train.evaluate scores (stride
    ``seq_len``, the text's first ``max_bytes``)."""
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    token_bytes = token_byte_lengths(AutoTokenizer.from_pretrained(folder))
    tokens = byte_prefix(tokens, token_bytes, max_bytes).astype(np.int64)
    nll_nats, size = 0.0, 0
    for start in range(0, len(tokens) - 1, seq_len):
        window = torch.from_numpy(tokens[start : start + seq_len + 1])[None]  # (1, T + 1)
        with torch.no_grad():
            log_probs = model(window[:, :-1]).logits.log_softmax(-1)  # (1, T, V)
        nll_nats -= log_probs.gather(-1, window[:, 1:, None]).sum().item()
        size += int(token_bytes[window[0, 1:]].sum())
    return nll_nats / math.log(2) / size


def _scores(run_dir: Path, folder: Path, source: str) -> tuple[float, float]:
    """(what the exported ``folder`` scores on ``source``'s validation text, what the run's
    summary says the source scored)."""
    cfg = load_run(run_dir).cfg
    got = _stock_bpb(folder, _validation(run_dir, source), cfg.seq_len, cfg.eval_bytes)
    summary = json.loads((run_dir / "summary.json").read_text())
    return got, summary["sources"][source]["val_bpb"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("variant", ["glob", "trim", "spec", "spec-opt"])
def test_an_exported_source_scores_what_the_run_measured(
    runs: Callable[..., Path], tmp_path: Path, variant: str, model: str
) -> None:
    # Prepare
    run_dir = runs(variant, model)
    # Execute
    folders = {s: export_source(run_dir, s, tmp_path / s) for s in SOURCES}
    # Assert
    for source, folder in folders.items():
        got, measured = _scores(run_dir, folder, source)
        assert math.isclose(got, measured, rel_tol=SAME_BPB), (source, got, measured)
        assert (
            f"bits per byte at the end of training: {measured:.4f}."
            in (folder / "README.md").read_text()
        )


def test_the_global_model_states_a_score_only_where_it_is_the_one_measured(
    runs: Callable[..., Path], tmp_path: Path
) -> None:
    # Prepare
    glob, trim = runs("glob"), runs("trim")
    # Execute
    folders = {run: export_global(run, tmp_path / run.parent.name) for run in (glob, trim)}
    # Assert: GLOB's global model is what scored each source; TRIM's scored none
    scores = [_scores(glob, folders[glob], s) for s in SOURCES]
    mean = json.loads((glob / "summary.json").read_text())["avg_val_bpb"]
    assert math.isclose(sum(got for got, _ in scores) / len(scores), mean, rel_tol=SAME_BPB)
    assert (
        f"averaged over the run's sources: {mean:.4f}." in (folders[glob] / "README.md").read_text()
    )
    readme = (folders[trim] / "README.md").read_text()
    assert "bits per byte" not in readme and "export a source" in readme


def _generate(folder: Path, prompt: str) -> str:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert out.shape[1] > ids.shape[1]
    return tokenizer.decode(out[0, ids.shape[1] :])


@pytest.mark.parametrize("device", DEVICES)  # where the run trained; the export is on the CPU
def test_a_spec_source_exports_generates_and_suppresses_the_ids_outside_vk(
    tmp_path: Path, node_cache: Path, device: str
) -> None:
    run_dir = _finished_run(tmp_path, node_cache, "spec", device=device)
    out = tmp_path / "greek"

    assert main([str(run_dir), "--source", "synth-greek", "--out", str(out)]) == 0

    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert isinstance(_generate(out, "α"), str)
    run = load_run(run_dir)
    spec = next(s for s in run_sources(run.cfg) if s.name == "synth-greek")
    client = SourceClient(
        run.cfg, spec, Workspace(tmp_path / "state", run.run_id, spec.name), run_sources(run.cfg)
    )
    assert client.vocab_map is not None
    exported = AutoModelForCausalLM.from_pretrained(out)
    suppressed = set(exported.generation_config.suppress_tokens)
    assert suppressed == set(range(len(client.tokenizer))) - set(client.vocab_map.kept_ids.tolist())


def test_a_cuda_run_exports_on_a_machine_without_cuda(tmp_path: Path, node_cache: Path) -> None:
    run_dir = _finished_run(tmp_path, node_cache, "spec-opt")
    config = run_dir / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "device": "cuda"}))

    out = export_source(run_dir, "synth-latin", tmp_path / "latin")

    assert isinstance(_generate(out, "a"), str)


def test_glob_exports_each_source_and_the_global_model(
    runs: Callable[..., Path], tmp_path: Path
) -> None:
    run_dir = runs("glob")
    export_source(run_dir, "synth-latin", tmp_path / "latin")
    assert main([str(run_dir), "--global", "--out", str(tmp_path / "global")]) == 0  # the help's
    for folder in ("latin", "global"):
        assert isinstance(_generate(tmp_path / folder, "a"), str)


def test_export_errors_name_the_problem(runs: Callable[..., Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json is missing") as unfinished:
        export_source(tmp_path, "x", tmp_path / "out")
    assert f"dept run --resume {tmp_path}" in str(unfinished.value)
    run_dir = runs("spec-opt")
    with pytest.raises(ConfigError, match="'nope' is not in the run's sources"):
        export_source(run_dir, "nope", tmp_path / "model")
    with pytest.raises(ConfigError, match="only glob and trim"):
        export_global(run_dir, tmp_path / "model")
    assert isinstance(_generate(export_source(run_dir, "synth-latin", tmp_path / "l"), "a"), str)


def test_export_replaces_an_earlier_one_only_with_force(
    runs: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = runs("spec-opt")
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
    runs: Callable[..., Path], tmp_path: Path, variant: str
) -> None:
    run_dir = runs(variant, "gpt2:debug")

    out = export_source(run_dir, "synth-latin", tmp_path / "latin")

    exported = AutoModelForCausalLM.from_pretrained(out)
    assert exported.config.model_type == "gpt2"
    ids = AutoTokenizer.from_pretrained(out)("a b", return_tensors="pt").input_ids
    assert exported.generate(ids).shape[1] <= 64, "the saved settings stay within ψ's rows"
    assert "gpt2" in (out / "README.md").read_text()
    if variant == "glob":
        assert isinstance(_generate(export_global(run_dir, tmp_path / "global"), "a"), str)
