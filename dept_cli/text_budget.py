"""``dept compare --budget bytes``: every method trains on the same bytes of text.

A token of SPEC-OPT's own tokenizer holds more text than one of the global tokenizer, so at
equal tokens SPEC-OPT sees more text: its better compression and its method are confounded.
With a byte budget the methods that share the global tokenizer keep the rounds ``--tokens``
gives them (the budget is the bytes GLOB trains there), and every other method gets the whole
rounds that train closest to the same bytes: SPEC-OPT fewer. A method's bytes per token is
measured on the sources' training token streams (the UTF-8 bytes of each token id, summed
over the stream, over its length), weighted as the method draws its sources: equally for
the federated methods and stratified STD, by ∝ n_k^τ for STD and ACT.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dept_cli.methods import BASELINES, own_tokenizer

BUDGETS = ("tokens", "bytes")


def stream_bytes_per_token(tokens: np.ndarray, token_bytes: np.ndarray) -> float:
    """Bytes of text per token of a tokenized stream (``token_bytes``: bytes of each id)."""
    return float(token_bytes[tokens].sum(dtype=np.int64)) / max(1, len(tokens))


@dataclass(frozen=True)
class TextRates:
    """What the sources' training streams hold per token, measured after preparation."""

    global_rates: dict[str, float]  # source -> bytes per token of the global tokenizer
    own_rates: dict[str, float]  # source -> bytes per token of the source's own tokenizer
    global_sizes: dict[str, int]  # source -> training tokens (global tokenizer): STD's n_k

    def bytes_per_token(self, method: str) -> float:
        """The expected bytes of text in one of ``method``'s training tokens."""
        rates = self.own_rates if own_tokenizer(method) else self.global_rates
        names = list(rates)
        baseline = BASELINES.get(method)
        if baseline is None:
            shares = np.full(len(names), 1 / len(names))
        else:
            from dept.train.baselines import temperature_probs  # late: torch, not for --help

            sizes = [self.global_sizes[n] for n in names]
            shares = temperature_probs(sizes, baseline.temperature)
        return float(sum(s * rates[n] for s, n in zip(shares, names, strict=True)))

    def rounds(self, method: str, reference_rounds: int, tokens_per_round: int) -> int:
        """The rounds of ``method`` that train closest to the bytes GLOB trains in
        ``reference_rounds`` rounds (at least one)."""
        budget = reference_rounds * tokens_per_round * self.bytes_per_token("glob")
        return max(1, round(budget / (tokens_per_round * self.bytes_per_token(method))))
