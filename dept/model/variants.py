"""The DEPT variants as data: which tokenizer a source uses and what of its model it shares.

DEPT (Iacob et al., ICLR 2025) splits a decoder into the body θ, the token embeddings φ and,
for models with learned absolute positions, the positional embeddings ψ. The variants differ
only in what of φ and ψ leaves a source's node:

=========  ==============  =====================================  =====================
variant    tokenizer       φ (token embeddings)                   ψ (positions)
=========  ==============  =====================================  =====================
GLOB       the run's one   the whole global φ, averaged by row    shared, averaged
TRIM       the run's one   the source's V_k rows of the global φ  shared, averaged
SPEC       the run's one   φ_k: its V_k rows + "other", kept      kept with the source
SPEC-OPT   its own         φ_k: its own vocabulary, kept          kept with the source
=========  ==============  =====================================  =====================

Which of its rows a GLOB or TRIM source sends after a round is :data:`EmbeddingRowsName`
(``embedding-rows``): by default those its round saw, each row averaged over its senders,
which is the paper's rule at the paper's scale (docs/variants.md says why).

Everything else asks :data:`VARIANTS`; nothing compares a variant's name. A new variant is one
more row here (and its name in :data:`VariantName`), plus code only where it needs a behaviour
no flag below describes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

VariantName = Literal["glob", "trim", "spec", "spec-opt"]
Sharing = Literal["none", "rows", "all"]
# Which of the φ rows a source shares go up after its round (GLOB, TRIM): every one, or those
# of the tokens its round's batches held (dept.train.seen_rows says why), each averaged over
# the sources that sent it; "seen-zero-filled" (an ablation) sends every row, those its round
# did not see as a zero update, so they are averaged over every source as under "all".
EmbeddingRowsName = Literal["all", "seen", "seen-zero-filled"]
EMBEDDING_ROWS: tuple[EmbeddingRowsName, ...] = get_args(EmbeddingRowsName)
RowWeightName = Literal["tokens", "occurrences"]  # a sent row's weight in its average
UnseenRowsName = Literal["train", "freeze"]  # local training of rows not seen yet (seen)


@dataclass(frozen=True)
class Variant:
    """What one variant does with the tokenizer, φ and ψ."""

    name: str
    own_tokenizer: bool  # each source trains its own tokenizer (else: the run's global one)
    # φ_k holds only the rows of the source's vocabulary V_k, plus "other"; exported, its rows
    # are spread back over the global tokenizer's ids (ids outside V_k suppressed). Without,
    # φ's rows are the tokenizer's ids (own tokenizer, or the whole global φ) and export as is.
    local_rows: bool
    embeddings: Sharing  # φ to the server: none, the V_k rows of the global φ, or all of it
    shares_positions: bool  # ψ (learned positions, where the model has them) is aggregated
    summary: str  # one line for the config key's doc

    @property
    def shares_embeddings(self) -> bool:
        """The server holds a global φ (and so the run has a global model to export)."""
        return self.embeddings != "none"

    @property
    def keeps_embeddings(self) -> bool:
        """A source's node keeps φ_k (or part of it) between rounds in its state."""
        return self.embeddings != "all"

    @property
    def keeps_state(self) -> bool:
        """A source's node keeps tensors of its own (φ_k, or ψ_k where the model learns
        positions): its state's embeddings file holds them, and export needs them."""
        return self.keeps_embeddings or not self.shares_positions


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("glob", False, False, "all", True, "the whole model: FedAvg on everything"),
        Variant("trim", False, True, "rows", True, "θ, ψ and its V_k rows of the global φ, by row"),
        Variant("spec", False, True, "none", False, "one global tokenizer, own V_k rows of φ"),
        Variant("spec-opt", True, False, "none", False, "own tokenizer and φ per source"),
    )
}


def variant(name: str) -> Variant:
    """The variant called ``name`` (a config key's value, checked by the schema)."""
    return VARIANTS[name]
