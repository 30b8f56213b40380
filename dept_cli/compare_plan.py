"""What a comparison runs: the shared settings, and one plan per method and learning rate.

The settings come from ``dept compare``'s options (:func:`base_config`); the rounds from the
token budget (:func:`rounds_for`), or, with ``--budget bytes``, from the text each method's
tokens hold (:func:`prepare` measures it, :class:`dept_cli.text_budget.TextRates` turns it
into rounds).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dept.config import ConfigError, DeptConfig, load_config, to_run_config
from dept.data.sources import SourceSpec, load_sources, run_sources, write_sources
from dept.model.variants import VARIANTS
from dept.paths import resolve_path
from dept_cli.methods import vocab_sizes
from dept_cli.seeds import run_folder
from dept_cli.text_budget import TextRates, stream_bytes_per_token
from server_app.config_pairs import parse_pairs

log = logging.getLogger(__name__)
COMPARED_SOURCES = "compared-sources.yaml"  # in --out: the sources every run reads
# The run config keys compare sets itself, and the option (or fact) that sets each.
OWN_KEYS = {
    "sources-file": "--sources-file",
    "model": "--model",
    "num-server-rounds": "--tokens (and --budget)",
    "local-steps": "--local-steps",
    "batch-size": "--batch-size",
    "seq-len": "--seq-len",
    "warmup-steps": "--warmup-steps",
    "global-vocab-size": "--global-vocab-size",
    "eval-bytes": "--eval-bytes",
    "outer-optimizer": "--outer-optimizer",
    "outer-lr": "--outer-lr",
    "outer-momentum": "--outer-momentum",
    "fraction-train": "nothing: every source trains every round",
    "seed": "--seed",
    "device": "--device",
    "state-dir": "--out",
    "output-dir": "--out",
    "wait-for-nodes-s": "nothing: compare's nodes are in process",
    "lr": "--lrs",
    "variant": "--methods",
}


@dataclass(frozen=True)
class Plan:
    """One run: a method at one learning rate."""

    method: str
    lr: float
    run_config: dict[str, Any]
    out_dir: str
    threads: int
    vocab_sizes: dict[str, int]  # the tokenizer size each source trains with
    bytes_per_token: float = math.nan  # of text per training token (NaN: not measured)

    @property
    def global_vocab_size(self) -> int:
        return int(self.run_config["global-vocab-size"])

    @property
    def vocabularies(self) -> dict[str, Any]:
        """What its result reports of the vocabularies, crashed or not."""
        return {"global_vocab_size": self.global_vocab_size, "source_vocab_sizes": self.vocab_sizes}

    @property
    def label(self) -> str:
        """``spec-opt lr 0.004``, and ``seed 1`` where the run is a further seed's."""
        seed = self.run_config.get("seed")
        further = self.out_dir.endswith(f"-seed{seed}")
        return f"{self.method} lr {self.lr:g}" + (f" seed {seed}" if further else "")


def rounds_for(tokens: float, sources: int, local_steps: int, batch_size: int, seq_len: int) -> int:
    """The rounds that train closest to ``tokens`` (at least one): each trains every source
    ``local_steps`` steps of ``batch_size`` sequences of ``seq_len`` tokens (see the help)."""
    return max(1, round(tokens / (sources * local_steps * batch_size * seq_len)))


def comparison_sources(sources_file: Path, global_vocab_size: int) -> list[SourceSpec]:
    """The sources of ``sources_file``, where an entry without a ``vocab-size`` gets the global
    one: with SourceSpec's default (2048) against a global 4096, SPEC-OPT started ahead in bits
    per byte at round 0, and the table showed the head start as a win."""
    return load_sources(sources_file, defaults={"vocab-size": global_vocab_size})


def base_config(args: argparse.Namespace, out: Path) -> DeptConfig:
    """The shared settings, reading the sources as :func:`comparison_sources` gives them
    (written to ``out/compared-sources.yaml``); rounds follow from the token budget."""
    specs = comparison_sources(resolve_path(args.sources_file), args.global_vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    sources_file = out / COMPARED_SOURCES
    write_sources(sources_file, specs)
    rounds = rounds_for(args.tokens, len(specs), args.local_steps, args.batch_size, args.seq_len)
    overrides = parse_pairs(args.run_config, "-c")
    own = sorted(k for k in overrides if k in OWN_KEYS)
    if own:
        raise ConfigError(
            "-c " + ", ".join(f"{k} is compare's own: use {OWN_KEYS[k]}" for k in own)
        )
    return load_config(
        {
            "sources-file": str(sources_file),
            "model": args.model,
            "num-server-rounds": rounds,
            "local-steps": args.local_steps,
            "batch-size": args.batch_size,
            "seq-len": args.seq_len,
            "warmup-steps": args.warmup_steps,  # clamped to a short run's steps by the config
            "global-vocab-size": args.global_vocab_size,
            "eval-bytes": args.eval_bytes,
            "outer-optimizer": args.outer_optimizer,
            "outer-lr": args.outer_lr,
            "outer-momentum": args.outer_momentum,
            "fraction-train": 1.0,
            "seed": args.seed,
            "device": args.device,
            "state-dir": str(out / "state"),
            "wait-for-nodes-s": 60.0,
        },
        overrides=overrides,
    )


def make_plans(
    args: argparse.Namespace,
    base: DeptConfig,
    out: Path,
    rates: TextRates | None = None,
    budget: str = "tokens",
) -> list[Plan]:
    """Every method at every rate (``args.methods``, ``args.lrs``) under each of
    ``args.seeds`` seeds from the base config's (:mod:`dept_cli.seeds`), the CPU threads shared
    equally between the ``args.jobs`` (the CPUs this process may run on: ``taskset`` gives
    two comparisons a core each); with ``rates``, each run knows its bytes of text per
    token, and ``budget`` bytes sets its rounds from them (:class:`TextRates`)."""
    threads = max(1, len(os.sched_getaffinity(0)) // args.jobs)
    specs = run_sources(base)
    if budget == "bytes" and rates is None:
        raise ValueError("--budget bytes needs the measured text rates (prepare)")
    per_round = len(specs) * base.local_steps * base.batch_size * base.seq_len
    seeds = range(base.seed, base.seed + args.seeds)
    plans = []
    for method in args.methods:
        rounds = base.num_server_rounds
        if rates is not None and budget == "bytes":
            rounds = rates.rounds(method, base.num_server_rounds, per_round)
        for lr, seed in itertools.product(args.lrs, seeds):
            run_dir = out / "runs" / run_folder(method, lr, seed, base.seed)
            config = {**to_run_config(base), "lr": lr, "output-dir": str(run_dir), "seed": seed}
            config["num-server-rounds"] = rounds
            if method in VARIANTS:  # a baseline reads no variant
                config["variant"] = method
            sizes = vocab_sizes(method, specs, base.global_vocab_size)
            rate = rates.bytes_per_token(method) if rates is not None else math.nan
            plans.append(Plan(method, lr, config, str(run_dir), threads, sizes, rate))
    return plans


def prepare(base: DeptConfig) -> TextRates:
    """Train every tokenizer and tokenize every source once, before the workers share them
    (two workers building the same cache would race): one variant per tokenizer kind, the
    sources' own or the run's global one (which the baselines use too). Returns what each
    kind's training tokens hold of text."""
    from dept.state.workspace import Workspace
    from dept.train.source_client import SourceClient

    specs = run_sources(base)
    root = resolve_path(base.state_dir)
    rates: dict[bool, dict[str, float]] = {}
    sizes: dict[str, int] = {}
    for own, variant in {v.own_tokenizer: v.name for v in VARIANTS.values()}.items():
        cfg = load_config({**to_run_config(base), "variant": variant})
        for spec in specs:
            log.info("preparing %s for %s", spec.name, variant)
            client = SourceClient(cfg, spec, Workspace(root, "prepare", spec.name), specs)
            train = client.tokens.train
            rates.setdefault(own, {})[spec.name] = stream_bytes_per_token(train, client.token_bytes)
            if not own:
                sizes[spec.name] = len(train)
    return TextRates(rates[False], rates[True], sizes)
