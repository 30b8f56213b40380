import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import dept.train.prepare
from dept.config import load_config
from dept.data.sources import load_sources
from dept.data.token_stream import TokenizedSource
from dept.model.build import build_model
from dept.model.roles import (
    EMBEDDING_NAMES,
    body_parameters,
    body_state,
    check_all_loaded,
    embedding_parameters,
)
from dept.state.workspace import Workspace
from dept.train import source_client
from dept.train.sharing import initial_tensors
from dept.train.source_client import SourceClient
from dept.wire import keys
from dept.wire.compression import decode, encode, payload_keys
from tests.helpers import DEVICES, assert_same_training, debug_run_config, share_cache


@pytest.fixture(autouse=True)
def _shared_cache(tmp_path: Path, node_cache: Path) -> None:
    """Every client here keeps its state under ``tmp_path/state``; its cache is the session's."""
    share_cache(tmp_path / "state", node_cache)


def _client(
    tmp_path: Path, variant: str, name: str = "synth-greek", **overrides: object
) -> SourceClient:
    cfg = load_config(
        debug_run_config(tmp_path, variant=variant, **{"global-vocab-size": 600, **overrides})
    )
    specs = [s for s in load_sources(None) if s.name.startswith("synth")]
    spec = next(s for s in specs if s.name == name)
    return SourceClient(cfg, spec, Workspace(tmp_path / "state", "run1", spec.name), specs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["spec-opt", "spec"])
def test_embeddings_and_position_persist_between_rounds(
    tmp_path: Path, variant: str, device: str
) -> None:
    client = _client(tmp_path, variant, device=device)
    body = body_state(build_model("debug", 300, 64, seed=0))
    result = client.train_round(body, global_step=0, server_round=1)
    assert result.delta.keys() == body.keys()
    assert all(d.dtype == torch.float32 for d in result.delta.values())
    after_round_1 = client.ws.load_state(before_round=2).state
    assert after_round_1 is not None and after_round_1.optimizer is not None
    position = after_round_1.position
    assert position.offset == client.cfg.local_steps * client.cfg.batch_size

    again = _client(tmp_path, variant, device=device)  # a new round builds anew from disk
    model = again.model(body, again.ws.load_state(before_round=2).state)
    assert model.device.type == device
    embeddings = embedding_parameters(model)["input"].detach().cpu()  # saved state: CPU
    assert torch.equal(embeddings, after_round_1.embeddings["input"]), "a copy, on any device"
    again.train_round(body, global_step=client.cfg.local_steps, server_round=2)
    assert again.ws.load_state(before_round=3).state.position.offset == 2 * position.offset


@pytest.mark.parametrize("device", DEVICES)
def test_a_rerun_round_starts_from_the_same_state_and_gives_the_same_update(
    tmp_path: Path, device: str
) -> None:
    client = _client(tmp_path, "spec-opt", device=device)
    body = body_state(build_model("debug", 300, 64, seed=0))
    client.train_round(body, global_step=0, server_round=1)
    first = client.train_round(body, global_step=8, server_round=2)
    rerun = client.train_round(body, global_step=8, server_round=2)  # the server resumed
    assert all(d.device.type == "cpu" for d in rerun.delta.values()), "it travels from the CPU"
    assert_same_training(rerun.delta, first.delta, device)  # bit for bit on the CPU
    for server_round in range(3, 7):
        client.train_round(body, global_step=8, server_round=server_round)
    kept = sorted(p.name for p in client.ws.dir.glob("round-*"))
    assert kept == ["round-0003", "round-0004", "round-0005", "round-0006"]


def test_spec_embeds_only_the_source_vocabulary(tmp_path: Path) -> None:
    client = _client(tmp_path, "spec")
    assert client.vocab_map is not None
    assert client.vocab_size < len(client.tokenizer), "V_k is smaller than the global vocabulary"
    other = _client(tmp_path, "spec", "synth-latin")
    assert other.tokenizer.get_vocab() == client.tokenizer.get_vocab(), "one global tokenizer"


def test_spec_opt_trains_a_tokenizer_per_source(tmp_path: Path) -> None:
    greek, latin = _client(tmp_path, "spec-opt"), _client(tmp_path, "spec-opt", "synth-latin")
    assert greek.tokenizer.get_vocab() != latin.tokenizer.get_vocab()
    assert greek.vocab_size == len(greek.tokenizer) <= greek.spec.vocab_size


def test_state_from_another_tokenizer_is_refused(tmp_path: Path) -> None:
    client = _client(tmp_path, "spec-opt")
    body = body_state(build_model("debug", 300, 64, seed=0))
    client.train_round(body, global_step=0, server_round=1)
    client.tokenizer_digest = "0" * 16  # as if the source's data changed mid-run
    with pytest.raises(ValueError, match="another tokenizer"):
        client.train_round(body, global_step=8, server_round=2)


@pytest.mark.parametrize("variant", ["spec-opt", "trim"])
def test_the_compression_residual_carries_over_a_node_restart(tmp_path: Path, variant: str) -> None:
    every = {"embedding-rows": "all"}  # TRIM: the whole of V_k goes up, so φ's shape holds
    client = _client(tmp_path, variant, compression="int8", **every)
    arrays = _shared_arrays(client)
    shapes = {n: tuple(v.shape) for n, v in arrays.items()}
    first = client.train_round(arrays, global_step=0, server_round=1)
    ids = {keys.EMBEDDING_IDS} if variant == "trim" else set()  # the rows it carries: V_k
    assert first.payload.keys() == payload_keys(shapes, "int8") | ids
    assert all(first.payload[n].dtype == torch.int8 for n in shapes), "φ rows too (TRIM)"
    residual = client.ws.load_state(before_round=2).state.residual
    sent = decode(first.payload, shapes, "int8")
    assert all(torch.equal(residual[n], first.delta[n] - sent[n]) for n in shapes)

    restarted = _client(tmp_path, variant, compression="int8", **every)  # a new process
    second = restarted.train_round(arrays, global_step=8, server_round=2)
    rerun = restarted.train_round(arrays, global_step=8, server_round=2)  # the server resumed
    # The same bytes: training on the CPU is deterministic (on CUDA it is not, see helpers).
    assert all(torch.equal(second.payload[k], rerun.payload[k]) for k in second.payload)
    expected = encode({n: second.delta[n] + residual[n] for n in shapes}, "int8")
    assert all(torch.equal(second.payload[k], expected[k]) for k in expected)


def test_without_error_feedback_nothing_is_kept(tmp_path: Path) -> None:
    client = _client(
        tmp_path, "spec-opt", compression="fp16", **{"compression-error-feedback": False}
    )
    result = client.train_round(_shared_arrays(client), global_step=0, server_round=1)
    assert all(v.dtype == torch.float16 for v in result.payload.values())
    assert client.ws.load_state(before_round=2).state.residual == {}


def _shared_arrays(client: SourceClient) -> dict[str, torch.Tensor]:
    """What the server would send ``client``: θ, plus φ's V_k rows for TRIM."""
    model = build_model("debug", 600, 64, seed=0)
    arrays = body_state(model)
    if client.shared_ids is not None:
        rows = torch.from_numpy(client.shared_ids.astype("int64"))
        arrays.update({n: p.detach()[rows] for n, p in embedding_parameters(model).items()})
    return arrays


def test_a_damaged_or_lost_state_is_reported_never_silent(tmp_path: Path) -> None:
    client = _client(tmp_path, "spec-opt")
    body = body_state(build_model("debug", 300, 64, seed=0))
    assert client.train_round(body, global_step=0, server_round=1).state_event == ""
    assert client.train_round(body, 8, server_round=2, last_trained=1).state_event == ""
    embeddings = client.ws.dir / "round-0002" / "embeddings.safetensors"
    embeddings.write_bytes(embeddings.read_bytes()[:50])  # a disk error in round 2's state

    older = client.train_round(body, 16, server_round=3, last_trained=2).state_event
    assert older.startswith("embeddings from the state of round 1 in round 3, not round 2's")
    assert "round 2: ValueError" in older and "does not match its SHA-256: damaged" in older
    shutil.rmtree(client.ws.dir)  # the whole state folder deleted between rounds
    lost = client.train_round(body, 24, server_round=4, last_trained=3).state_event
    assert lost == "fresh embeddings in round 4: state lost (no saved state)"
    _, evaluated = client.evaluate(body, server_round=4, last_trained=4)
    assert evaluated == "", "round 4's own state is there again"


@pytest.mark.parametrize("variant", ["spec-opt", "glob", "trim"])
def test_a_token_id_without_a_row_is_refused_on_the_cpu(
    tmp_path: Path, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA such an id would be a device-side assert that breaks the worker for good."""
    size = len(_client(tmp_path, variant).tokenizer)
    tokenize = dept.train.prepare.tokenize_source

    def with_a_bad_id(*args: object) -> TokenizedSource:
        tokens = tokenize(*args)  # type: ignore[arg-type]
        validation = np.array(tokens.validation)  # the cache is read-only: a copy
        validation[5] = size  # one past the last id
        return TokenizedSource(tokens.train, validation)

    monkeypatch.setattr(dept.train.prepare, "tokenize_source", with_a_bad_id)
    with pytest.raises(ValueError) as refused:
        _client(tmp_path, variant)
    assert str(refused.value).startswith(
        f"source 'synth-greek': token id {size} in its validation tokens is outside its "
        f"tokenizer's vocabulary of {size} ids"
    )


@pytest.mark.parametrize("model", ["debug", "gpt2:debug"])
@pytest.mark.parametrize("variant", ["glob", "trim", "spec", "spec-opt"])
def test_a_model_built_without_drawing_is_the_one_built_with(
    tmp_path: Path, variant: str, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client builds its model without initial values (every parameter is loaded): the
    same tensors, buffers and tying as a model drawn first and then loaded."""
    client = _client(tmp_path, variant, model=model, **{"tie-embeddings": model == "debug"})
    server, _ = initial_tensors(client.cfg)
    arrays = {n: v for n, v in server.items() if n not in EMBEDDING_NAMES}
    if client.variant.shares_embeddings:  # GLOB all rows, TRIM its V_k rows
        rows = client.shared_ids
        pick = slice(None) if rows is None else torch.from_numpy(rows.astype("int64"))
        arrays |= {n: server[n][pick] for n in EMBEDDING_NAMES if n in server}
    built = client.model(arrays, None)
    drawn = source_client.build_model
    monkeypatch.setattr(
        source_client, "build_model", lambda *a, **k: drawn(*a, **{**k, "initialise": True})
    )
    reference = client.model(arrays, None)
    assert built.state_dict().keys() == reference.state_dict().keys()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(built.state_dict()[name], tensor), name
    tied = [
        m.get_output_embeddings().weight is m.get_input_embeddings().weight
        for m in (built, reference)
    ]
    assert tied[0] == tied[1] == (model == "debug")


def test_a_parameter_left_unloaded_is_refused() -> None:
    model = build_model("debug", 300, 64, initialise=False)
    with pytest.raises(RuntimeError, match=r"neither received nor kept by the source: .*embed"):
        check_all_loaded(model, list(body_parameters(model).values()))
