"""What a source needs before it trains: its text, its tokenizer and its tokens on disk.

The client (:class:`dept.train.source_client.SourceClient`) and ``dept prepare`` both call
:func:`prepare_source`, so a source prepared ahead of a run is exactly what the run reads:
the same tokenizer (its own for SPEC-OPT, else the run's global one) and the same token
cache, found again by key instead of being rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from dept.config import DeptConfig
from dept.data.corpus import SourceText, load_source_text
from dept.data.sources import SourceSpec
from dept.data.token_stream import TokenizedSource, tokenize_source
from dept.data.vocab import check_fits, load_tokenizer, tokenizer_digest
from dept.model.variants import variant
from dept.state.workspace import global_tokenizer, own_tokenizer


@dataclass
class PreparedSource:
    text: SourceText
    tokenizer_file: Path
    tokenizer: PreTrainedTokenizerFast
    tokenizer_digest: str
    tokens: TokenizedSource


def prepare_source(
    cfg: DeptConfig,
    spec: SourceSpec,
    cache: Path,
    all_sources: list[SourceSpec] | None = None,
    global_tokenizer_file: Path | None = None,
) -> PreparedSource:
    """Read ``spec``'s text, train (or find) its tokenizer and tokenize it, each once.

    ``all_sources`` train the global tokenizer where ``global_tokenizer_file`` does not give
    it (default: ``spec`` alone).
    """
    text = load_source_text(spec, cache, cfg.seed)
    if variant(cfg.variant).own_tokenizer:
        path = own_tokenizer(spec, text, cache, cfg.seed)
    else:
        path = global_tokenizer_file or global_tokenizer(
            all_sources or [spec], cfg.global_vocab_size, cache, cfg.seed
        )
    tokenizer = load_tokenizer(path)
    if not variant(cfg.variant).own_tokenizer:  # the run's one: global-vocab-size says its size
        check_fits(tokenizer, path, cfg.global_vocab_size)
    digest = tokenizer_digest(path)
    tokens = tokenize_source(text, tokenizer, digest, cache / "tokens" / spec.name)
    return PreparedSource(text, path, tokenizer, digest, tokens)
