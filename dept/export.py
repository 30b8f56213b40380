"""Export a finished run as Hugging Face model folders that load offline (the library;
``dept export`` is :mod:`dept_cli.export`).

A source's model is the run's final body θ with that source's embeddings and tokenizer: its
own (SPEC-OPT), or the global tokenizer with φ_k spread back over the global ids (SPEC,
TRIM: each id outside V_k gets a copy of the "other" row, and is suppressed in generation,
since the model never learnt to tell those ids apart). The run's softmax counted that row
once for each of those ids (:func:`dept.train.local.next_token_logits`), so the exported model
gives every token the probability the run measured, and its README states the run's bits
per byte as its own. The global model of GLOB and TRIM is θ (and ψ) with the server's φ and
the global tokenizer; a source's model has its own ψ_k where it kept one. Each folder holds
``config.json``, ``model.safetensors``, the tokenizer files, ``generation_config.json`` and
a short ``README.md``, so ``AutoModelForCausalLM.from_pretrained(dir)`` and
``AutoTokenizer.from_pretrained(dir)`` work. A folder that already holds files is replaced
only with ``--force``.

Run on the machine that holds the source's state directory (its node, in a deployment).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast

from dept.config import ConfigError, DeptConfig, load_config, to_run_config
from dept.data.sources import load_sources, run_sources
from dept.data.vocab import check_fits, load_tokenizer
from dept.model.build import build_model
from dept.model.families import family_of
from dept.model.roles import (
    body_parameters,
    embedding_parameters,
    load_tensors,
    position_parameters,
)
from dept.model.variants import VARIANTS, variant
from dept.paths import default_state_root, resolve_path
from dept.state.files import new_file_mode, replace_dir
from dept.state.workspace import Workspace, global_tokenizer
from dept.train.source_client import SourceClient

RUN_CONFIG_FILE = "dept-run-config.json"  # in a model folder: the run config it trained with


@dataclass
class FinishedRun:
    cfg: DeptConfig
    run_id: str
    body: dict[str, torch.Tensor]
    embeddings: dict[str, torch.Tensor]  # the server's global φ (GLOB, TRIM), else empty
    summary: dict


def load_run(run_dir: Path) -> FinishedRun:
    """The config, run id and final tensors a finished run left in its output folder. The
    config's ``device`` becomes ``cpu``: an export builds the model on the CPU and saves it
    from there, wherever the run trained (a ``cuda`` run exports on a machine without one)."""
    for name in ("config.json", "summary.json", "body.safetensors"):
        if not (run_dir / name).is_file():
            raise ConfigError(
                f"{run_dir / name} is missing: export needs a finished run's output-dir "
                f"(an interrupted run finishes with: dept run --resume {run_dir})"
            )
    cfg = replace(load_config(json.loads((run_dir / "config.json").read_text())), device="cpu")
    summary = json.loads((run_dir / "summary.json").read_text())
    embeddings_file = run_dir / "embeddings.safetensors"
    return FinishedRun(
        cfg,
        str(summary["run_id"]),
        load_file(str(run_dir / "body.safetensors")),
        load_file(str(embeddings_file)) if embeddings_file.is_file() else {},
        summary,
    )


def export_source(
    run_dir: Path,
    source: str,
    out: Path,
    *,
    state_dir: Path | None = None,
    sources_file: Path | None = None,
    global_tokenizer_file: Path | None = None,
    force: bool = False,
) -> Path:
    """Write ``source``'s model folder to ``out`` (:func:`check_destination`). On a deployed
    node pass its ``global-tokenizer`` (SPEC, TRIM, GLOB), as the node itself was given."""
    check_destination(out, force)
    run = load_run(run_dir)
    specs = load_sources(sources_file) if sources_file else run_sources(run.cfg)
    spec = next((s for s in specs if s.name == source), None)
    if spec is None:
        raise ConfigError(
            f"source {source!r} is not in the run's sources ({', '.join(s.name for s in specs)})"
        )
    root = state_dir or state_root(run.cfg)
    client = SourceClient(
        run.cfg, spec, Workspace(root, run.run_id, spec.name), specs, global_tokenizer_file
    )
    state = client.state(before_round=run.cfg.num_server_rounds + 1).state
    if state is None and client.variant.keeps_state:
        raise ConfigError(
            f"source {source!r} has no trained state under {client.ws.dir}: it never trained "
            "in this run, or 'state-dir' points elsewhere (pass --state-dir)"
        )
    arrays = dict(run.body)
    ids = client.shared_ids
    for name, value in run.embeddings.items():
        arrays[name] = value if ids is None else value[torch.from_numpy(ids)]
    local = client.model(arrays, state)
    model, suppressed = _on_tokenizer_ids(local, client, run.cfg)
    bpb = run.summary.get("sources", {}).get(source, {}).get("val_bpb")
    score = f"Validation bits per byte at the end of training: {bpb:.4f}.\n" if bpb else ""
    _save(model, client.tokenizer, out, suppressed, run.cfg, f"source `{source}`", score)
    return out


def export_global(
    run_dir: Path,
    out: Path,
    *,
    state_dir: Path | None = None,
    global_tokenizer_file: Path | None = None,
    force: bool = False,
) -> Path:
    """Write the GLOB/TRIM global model (θ, the server's φ, the global tokenizer) to ``out``
    (:func:`check_destination`)."""
    check_destination(out, force)
    run = load_run(run_dir)
    if not variant(run.cfg.variant).shares_embeddings:
        with_global = " and ".join(v.name for v in VARIANTS.values() if v.shares_embeddings)
        raise ConfigError(
            f"variant {run.cfg.variant!r} has no global embeddings: only {with_global} runs "
            "have a global model; export a source instead (--source NAME)"
        )
    root = state_dir or state_root(run.cfg)
    path = global_tokenizer_file or global_tokenizer(
        run_sources(run.cfg), run.cfg.global_vocab_size, root / "cache", run.cfg.seed
    )
    tokenizer = load_tokenizer(path)
    check_fits(tokenizer, path, run.cfg.global_vocab_size)
    model = _fresh(run.cfg, run.cfg.global_vocab_size)
    load_tensors(_not_embeddings(model), run.body, "the run's body")  # θ, and the shared ψ
    with torch.no_grad():
        for name, param in embedding_parameters(model).items():
            param.copy_(run.embeddings[name])
    unused = list(range(len(tokenizer), run.cfg.global_vocab_size))
    _save(model, tokenizer, out, unused, run.cfg, "the global model", _global_score(run))
    return out


def export_baseline(
    model: PreTrainedModel,
    cfg: DeptConfig,
    state_root: Path,
    out: Path,
    *,
    name: str,
    avg_bpb: float,
) -> Path:
    """Write a baseline's (STD, ACT) model, trained on the run's global tokenizer, to ``out``,
    replacing an earlier one: ``dept eval`` and ``transformers`` load it like an export."""
    path = global_tokenizer(run_sources(cfg), cfg.global_vocab_size, state_root / "cache", cfg.seed)
    how = f"as the {name} baseline, one model on the mixture of the sources"
    return export_trained(model, cfg, path, out, name=name, how=how, avg_bpb=avg_bpb)


def export_trained(
    model: PreTrainedModel,
    cfg: DeptConfig,
    tokenizer_file: Path,
    out: Path,
    *,
    name: str,
    how: str,
    avg_bpb: float,
) -> Path:
    """Write a model trained outside the federation (a baseline, a body after continued
    pre-training) with the tokenizer in ``tokenizer_file`` to ``out``; ``how``: for its README."""
    tokenizer = load_tokenizer(tokenizer_file)
    rows = embedding_parameters(model)  # the model has as many rows as the tokenizer, or more
    unused = list(range(len(tokenizer), max(p.shape[0] for p in rows.values())))
    score = f"Validation bits per byte at the end, averaged over its sources: {avg_bpb:.4f}.\n"
    _save(model, tokenizer, out, unused, cfg, "every source's model", score, trained=name, how=how)
    return out


def _global_score(run: FinishedRun) -> str:
    """What the README says of the global model's quality. GLOB scored every source with
    this very model, so the mean of their bits per byte is its own. TRIM scored each source
    with its own model (its V_k rows, its "other" row and no other id), never this one: no
    figure of the run is this model's, and none is given."""
    if variant(run.cfg.variant).keeps_state:
        return (
            "The run scored each source with its own rows of these embeddings, not with this "
            "model: export a source (--source) for a model with a measured score.\n"
        )
    bpb = run.summary.get("avg_val_bpb")
    return (
        f"Validation bits per byte at the end of training, averaged over the run's sources: "
        f"{bpb:.4f}.\n"
        if bpb
        else ""
    )


def check_destination(out: Path, force: bool) -> None:
    """Refuse (FileExistsError) a folder ``out`` that holds anything, unless ``force`` (as
    ``dept certs`` does): then the export replaces it whole, so only an earlier export is
    replaced, never a folder of other files (a run's output-dir) named by mistake."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"refusing to export into {out}: it is a file, not a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise FileExistsError(f"refusing to overwrite {out} (pass --force to replace it)")
    model = [*out.glob("model*.safetensors"), *out.glob("model.safetensors.index.json")]
    if not (out / "config.json").is_file() or not model:
        raise FileExistsError(
            f"refusing to replace {out} even with --force: it is not an exported model "
            "(no config.json and model.safetensors); remove it yourself"
        )


def state_root(cfg: DeptConfig) -> Path:
    """Where a run's sources keep their state: its ``state-dir``, else the shared default."""
    return resolve_path(cfg.state_dir) if cfg.state_dir else default_state_root()


def _fresh(cfg: DeptConfig, vocab_size: int) -> PreTrainedModel:
    return build_model(
        cfg.model, vocab_size, cfg.seq_len, tie_embeddings=cfg.tie_embeddings, seed=cfg.seed
    )


def _not_embeddings(model: PreTrainedModel) -> dict[str, torch.nn.Parameter]:
    """θ and ψ: what does not depend on the vocabulary."""
    return {**body_parameters(model), **position_parameters(model)}


def _on_tokenizer_ids(
    local: PreTrainedModel, client: SourceClient, cfg: DeptConfig
) -> tuple[PreTrainedModel, list[int]]:
    """The model on the tokenizer's own ids, and the ids generation must never produce."""
    vmap = client.vocab_map
    if vmap is None:  # SPEC-OPT (own tokenizer) or GLOB: rows are already token ids
        unused = list(range(len(client.tokenizer), client.vocab_size))
        return local, unused
    size = len(client.tokenizer)
    model = _fresh(cfg, size)
    load_tensors(_not_embeddings(model), _not_embeddings(local), "body")
    rows = vmap.to_local(np.arange(size))
    with torch.no_grad():
        for name, param in embedding_parameters(model).items():
            param.copy_(embedding_parameters(local)[name][torch.from_numpy(rows)])
    outside = [int(i) for i in np.flatnonzero(rows == vmap.other_row)]
    return model, outside


def _save(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    out: Path,
    suppressed: list[int],
    cfg: DeptConfig,
    what: str,
    score: str,
    trained: str = "",
    how: str = "",
) -> None:
    """``score``: the README's sentence on the model's measured quality ("" for none);
    ``trained``: what trained it, where not DEPT (a baseline's name), and ``how``."""
    eos = tokenizer.eos_token_id
    model.config.eos_token_id = eos
    model.config.pad_token_id = eos
    model.config.bos_token_id = None
    family = family_of(model)
    # Learned positions end at the context length: prompt and continuation must fit in it.
    length = (
        {"max_length": getattr(model.config, family.max_positions_key)}
        if family.positions
        else {"max_new_tokens": cfg.seq_len}
    )
    model.generation_config = GenerationConfig(
        eos_token_id=eos,
        pad_token_id=eos,
        do_sample=True,
        top_p=0.95,
        temperature=0.8,
        suppress_tokens=[i for i in suppressed if i != eos] or None,
        **length,
    )
    readme = (
        f"# {trained or f'DEPT {cfg.variant}'}: {what}\n\n"
        f"{family.name} `{cfg.model}` model trained {how or 'with DEPT on Flower'} "
        f"({cfg.num_server_rounds} rounds x {cfg.local_steps} local steps, "
        f"context {cfg.seq_len} tokens).\n"
        + score
        + (
            f"{len(suppressed)} token ids this model never learnt to tell apart are "
            "suppressed in generation.\n"
            if suppressed
            else ""
        )
    )
    # the run config lets dept eval and dept finetune take the folder alone
    config = json.dumps(to_run_config(cfg), indent=2)
    _write_folder(model, tokenizer, {"README.md": readme, RUN_CONFIG_FILE: config}, out)


def _write_folder(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, texts: dict[str, str], out: Path
) -> None:
    """The model folder with ``texts`` (name: content) beside the model, written next to
    ``out`` and renamed over it: an export that fails leaves no half folder, and a replaced
    one keeps none of its old files."""
    out = out.resolve()
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    for name, text in texts.items():
        (tmp / name).write_text(text)
    mode = new_file_mode(tmp)  # safetensors writes its files 0600
    for path in tmp.iterdir():
        path.chmod(mode)
    replace_dir(tmp, out)
