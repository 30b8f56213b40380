"""Will the run fit? Memory and time estimated from the config before any work starts.

A typo in a size (``global-vocab-size=10000000``, ``grad-accum-steps=100000``) should stop a
run in a second with the key named, not after it has eaten the machine's memory or sat for
an hour without a step. The estimates are lower bounds, so a run they refuse could never
have worked there:

- memory: what must be resident at once, nothing more: a client's weights, gradients and
  AdamW moments (16 bytes a parameter) plus one micro-batch's logits and their gradient
  (B × T × V, twice, float32); the server's shared tensors with their outer optimizer state
  and the one round mean it forms;
- time: 6 × parameters × tokens of one round's training at the device's peak rate, against
  ``round-timeout-s`` (a reply later than that is dropped anyway).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

from dept.config import MIN_VOCAB_SIZE, ConfigError, DeptConfig, snake
from dept.data.sources import SourceSpec
from dept.model.outer_optimizers import OUTER_OPTIMIZERS
from dept.model.variants import variant

FLOAT32 = 4
ADAMW_BYTES_PER_PARAM = 16  # weight, gradient and two moments, float32
# Optimistic peaks, so the time estimate stays a lower bound on any such device.
PEAK_FLOPS_PER_CPU_THREAD = 2.5e11  # AVX-512, 2 FMA units, 4 GHz
PEAK_FLOPS = {"cuda": 2.5e15, "mps": 5e13}  # no GPU of today is faster in dense bf16


@dataclass(frozen=True)
class Device:
    """What a run can use on one machine: memory (bytes) and a peak rate (FLOP/s)."""

    kind: str
    memory: float
    peak_flops: float
    beside: str = ""  # what else holds this memory, said in an error ("the server's 9.9 GB")

    @classmethod
    def here(cls, kind: str, cpu_threads: int = 0) -> Device:
        """This machine's ``kind`` device: ``cuda``/``mps`` memory of device 0, else RAM; a
        CPU's peak from ``cpu_threads``, or where 0 from torch's threads as set."""
        if kind == "cuda":
            import torch  # late: dept run's checks of a CPU run need none of it

            if torch.cuda.is_available():
                memory = float(torch.cuda.get_device_properties(0).total_memory)
                return cls(kind, memory, PEAK_FLOPS["cuda"])
        if kind == "mps":
            return cls(kind, machine_memory(), PEAK_FLOPS["mps"])
        if not cpu_threads:
            import torch

            cpu_threads = torch.get_num_threads()
        return cls("cpu", machine_memory(), cpu_threads * PEAK_FLOPS_PER_CPU_THREAD)


def machine_memory() -> float:
    """This machine's RAM, bytes."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@functools.cache
def body_params(model: str) -> int:
    """θ's size for ``model``: a preset's from its family's formula, a config file's counted
    on a model built on the meta device (no memory)."""
    from dept.model.families import model_choice

    choice = model_choice(model)
    if choice.size is not None:
        return choice.family.body_size(choice.size)
    import torch

    from dept.model.build import build_model
    from dept.model.roles import body_parameters

    with torch.device("meta"):
        built = build_model(model, 512, 8)
    return sum(p.numel() for p in body_parameters(built).values())


def trained_body_params(cfg: DeptConfig, shared_only: bool = False) -> int:
    """θ plus ψ, the learned positions (every client trains them; the server holds them
    where the variant shares them, so ``shared_only`` leaves them out where it does not)."""
    from dept.model.families import position_count

    with_positions = not shared_only or variant(cfg.variant).shares_positions
    return body_params(cfg.model) + (
        position_count(cfg.model, cfg.seq_len) if with_positions else 0
    )


def head_params(cfg: DeptConfig, vocab_size: int) -> int:
    """One (V, d) embedding matrix: the output head's matmul, every token."""
    from dept.model.families import model_width

    return vocab_size * model_width(cfg.model)


def embedding_params(cfg: DeptConfig, vocab_size: int) -> int:
    return head_params(cfg, vocab_size) * (1 if cfg.tie_embeddings else 2)


def vocab_key(cfg: DeptConfig, spec: SourceSpec) -> str:
    """Where a source's embedding rows come from, to name in an error."""
    if variant(cfg.variant).own_tokenizer:
        return f"source '{spec.name}' key 'vocab-size'"
    return "config key 'global-vocab-size'"


def check_source_fits(cfg: DeptConfig, spec: SourceSpec, device: Device) -> None:
    """:func:`check_client_fits` before any tokenizer exists, at the fewest embedding rows
    the source can end with: the global φ's for GLOB (it embeds all of them), the smallest
    vocabulary otherwise (a SPEC-OPT tokenizer, or a SPEC/TRIM V_k, may be far smaller than
    asked). The exact check follows once the source knows its rows."""
    rows = cfg.global_vocab_size if variant(cfg.variant).embeddings == "all" else MIN_VOCAB_SIZE
    check_client_fits(cfg, rows, vocab_key(cfg, spec), device, spec.nproc)


def check_client_fits(
    cfg: DeptConfig, vocab_size: int, vocab_from: str, device: Device, nproc: int = 1
) -> None:
    """Refuse, naming the key, a client that cannot hold its training or finish a round.

    ``vocab_from`` names where ``vocab_size`` comes from (:func:`vocab_key`), e.g. ``config
    key 'global-vocab-size'`` or ``source 'de-novels' key 'vocab-size'``. With ``nproc``
    processes, each device holds batch-size / nproc rows, and under FSDP a 1/nproc share of
    the training state (but the whole float32 weights once, while they are sharded)."""
    body, embedding = trained_body_params(cfg), embedding_params(cfg, vocab_size)
    shards = nproc if cfg.data_parallel == "fsdp" else 1
    weights = max(FLOAT32, ADAMW_BYTES_PER_PARAM / shards) * (body + embedding)
    logits = 2 * FLOAT32 * cfg.batch_size // nproc * cfg.seq_len * vocab_size
    need = weights + logits
    if need > device.memory:
        where = _culprit(cfg, vocab_size, vocab_from, logits > weights, embedding > body)
        raise ConfigError(
            f"{where}: a client needs at least {gb(need)} "
            f"({gb(weights)} for the weights, gradients and AdamW moments of "
            f"{body + embedding:,} parameters, {gb(logits)} for one micro-batch's logits of "
            f"batch-size {cfg.batch_size} x seq-len {cfg.seq_len} x {vocab_size:,} tokens), "
            f"more than this {device.kind}'s {gb(device.memory)}"
            + (f" left beside {device.beside}" if device.beside else "")
        )
    # FLOPs: the input embedding and ψ are lookups; the output head is a (V, d) matmul a token.
    devices = nproc if device.kind == "cuda" else 1  # CPU processes share the same cores
    rate = dataclasses.replace(device, peak_flops=device.peak_flops * devices)
    _check_round_time(cfg, body_params(cfg.model) + head_params(cfg, vocab_size), rate)


def _culprit(
    cfg: DeptConfig, vocab_size: int, vocab_from: str, by_logits: bool, by_embedding: bool
) -> str:
    """The key to name for a client that does not fit: of the logits' factors the one most
    above its default, else the vocabulary or the model, whichever is larger."""
    if by_logits:
        ratios = {
            f"{vocab_from} ({vocab_size:,})": vocab_size / DeptConfig.global_vocab_size,
            f"config key 'seq-len' ({cfg.seq_len:,})": cfg.seq_len / DeptConfig.seq_len,
            f"config key 'batch-size' ({cfg.batch_size:,})": cfg.batch_size / DeptConfig.batch_size,
        }
        return max(ratios, key=lambda k: ratios[k])
    return f"{vocab_from} ({vocab_size:,})" if by_embedding else f"config key 'model' ({cfg.model})"


def _check_round_time(cfg: DeptConfig, params: int, device: Device) -> None:
    tokens = cfg.local_steps * cfg.grad_accum_steps * cfg.batch_size * cfg.seq_len
    seconds = 6 * params * tokens / device.peak_flops
    if seconds <= cfg.round_timeout_s:
        return
    factors = {"grad-accum-steps": cfg.grad_accum_steps, "local-steps": cfg.local_steps}
    factors.update({"batch-size": cfg.batch_size, "seq-len": cfg.seq_len})
    key = max(factors, key=lambda k: factors[k] / getattr(DeptConfig, snake(k)))  # vs default
    product = " x ".join(f"{k} {v:,}" for k, v in factors.items())
    raise ConfigError(
        f"config key '{key}' ({factors[key]:,}): a round trains {tokens:,} tokens per source "
        f"({product}), at least {seconds:,.0f} s even at this {device.kind}'s peak "
        f"({device.peak_flops:.1e} FLOP/s); replies later than 'round-timeout-s' "
        f"({cfg.round_timeout_s:g} s) are dropped"
    )


def server_need(cfg: DeptConfig, shared_vocab: int) -> float:
    """Bytes the server holds: the shared tensors, a round's mean and the outer optimizer's
    state, float32 (``shared_vocab``: rows of the global φ, 0 if none)."""
    body = trained_body_params(cfg, shared_only=True)
    return FLOAT32 * _server_copies(cfg) * (body + embedding_params(cfg, shared_vocab))


def _server_copies(cfg: DeptConfig) -> int:
    return 2 + OUTER_OPTIMIZERS[cfg.outer_optimizer].state_copies  # θ, its mean, outer state


def check_server_fits(cfg: DeptConfig, shared_vocab: int, memory: float) -> None:
    """Refuse, naming the key, a server that cannot hold :func:`server_need`."""
    body = trained_body_params(cfg, shared_only=True)
    embedding = embedding_params(cfg, shared_vocab)
    need = server_need(cfg, shared_vocab)
    if need > memory:
        key = "global-vocab-size" if embedding > body else "model"
        value = f"{shared_vocab:,}" if embedding > body else cfg.model
        raise ConfigError(
            f"config key '{key}' ({value}): the server needs at least {gb(need)} for "
            f"{body + embedding:,} shared parameters ({_server_copies(cfg)} float32 copies with "
            f"outer-optimizer {cfg.outer_optimizer}), more than this machine's {gb(memory)}"
        )


def gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def shared_vocab_size(cfg: DeptConfig) -> int:
    """Rows of the global φ the server holds and shares (GLOB, TRIM); 0 for none."""
    return cfg.global_vocab_size if variant(cfg.variant).shares_embeddings else 0
