"""What ``dept compare`` runs: the paper's baselines, then every DEPT variant.

The variants are :data:`dept.model.variants.VARIANTS` (a new one is compared without a change
here); the baselines train one model on the mixture of all sources with the global tokenizer
(:func:`dept.train.baselines.run_standard`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dept.data.sources import SourceSpec
from dept.model.variants import VARIANTS


@dataclass(frozen=True)
class Baseline:
    """STD, or ACT (STD with active forgetting), at one sampling temperature."""

    title: str
    temperature: float  # sources sampled ∝ size^τ: 0 uniform, 1 proportional
    forgets: bool = False  # ACT: the embeddings are re-initialised every act-period steps


BASELINES: dict[str, Baseline] = {
    "std-0": Baseline("STD τ=0", 0.0),
    "std-0.3": Baseline("STD τ=0.3", 0.3),
    "std-1": Baseline("STD τ=1", 1.0),
    "act": Baseline("ACT", 0.3, forgets=True),
}
FEDERATED: tuple[str, ...] = tuple(VARIANTS)
METHODS: tuple[str, ...] = (*BASELINES, *FEDERATED)


def title(method: str) -> str:
    """A method's name in the paper (a table's column heading)."""
    return BASELINES[method].title if method in BASELINES else method.upper()


def own_tokenizer(method: str) -> bool:
    """Each source trains its own tokenizer (SPEC-OPT): perplexities per token do not compare."""
    return method in VARIANTS and VARIANTS[method].own_tokenizer


def vocab_sizes(method: str, specs: list[SourceSpec], global_size: int) -> dict[str, int]:
    """The size of the tokenizer each source trains with under ``method``: its own
    ``vocab-size`` where the method gives each source its own tokenizer, else the global one."""
    return {s.name: s.vocab_size if own_tokenizer(method) else global_size for s in specs}
