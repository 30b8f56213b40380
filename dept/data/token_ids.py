"""A token stream checked against its tokenizer before it trains (:func:`check_token_ids`)."""

from __future__ import annotations

from pathlib import Path

from dept.data.shards import id_range
from dept.data.token_stream import TokenizedSource


def check_token_ids(source: str, tokens: TokenizedSource, size: int, tokenizer: Path) -> None:
    """Every id of the token stream must have a row: an id past the embedding is a clean
    IndexError on the CPU, but on CUDA a device-side assert, after which every later
    message to the same worker (a Ray actor) fails too. ``size``: the tokenizer's ids (SPEC
    and TRIM map these to rows; GLOB has more rows)."""
    for split, ids in (("train", tokens.train), ("validation", tokens.validation)):
        # the range the cache recorded when it was written: a GB-scale stream is not read
        # again per message (nor per rank); scanned only where none was recorded
        low, high = (tokens.id_ranges or {}).get(split) or id_range(ids)
        if high < low or 0 <= low <= high < size:
            continue
        bad = ids[(ids < 0) | (ids >= size)][0]
        raise ValueError(
            f"source {source!r}: token id {int(bad)} in its {split} tokens is outside its "
            f"tokenizer's vocabulary of {size} ids ({tokenizer}): the tokenizer's ids are not "
            "contiguous, or the tokens came from another one"
        )
