"""Validation loss, perplexity per token, and bits per byte (comparable across vocabularies).

bits per byte = total negative log-likelihood in bits / UTF-8 bytes of the predicted text,
where each EOS counts one byte (the document boundary it stands for).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from dept.data.vocab import VocabMap
from dept.train.local import autocast, next_token_logits

SCAN_CHUNK = 1 << 22  # tokens whose bytes are summed at a time


@dataclass
class EvalResult:
    loss: float  # mean NLL per token, nats
    perplexity: float
    bits_per_byte: float
    tokens: int
    bytes: int


def byte_prefix(tokens: np.ndarray, token_bytes: np.ndarray, max_bytes: int) -> np.ndarray:
    """The shortest prefix of ``tokens`` whose predicted tokens cover ``max_bytes`` of text.

    Cutting by bytes, not tokens, scores every method on the same text whatever its
    tokenizer (to within one token); 0 keeps everything.
    """
    if max_bytes <= 0 or len(tokens) < 2:
        return tokens
    covered = 0  # bytes of the predicted tokens before ``start``, scanned a chunk at a time
    for start in range(1, len(tokens), SCAN_CHUNK):  # (a memory-mapped stream stays on disk)
        cumulative = covered + np.cumsum(token_bytes[tokens[start : start + SCAN_CHUNK]])
        if cumulative[-1] >= max_bytes:
            targets = start + int(np.searchsorted(cumulative, max_bytes))
            return tokens[: targets + 1]
        covered = int(cumulative[-1])
    return tokens


@torch.no_grad()
def evaluate_stream(
    model: PreTrainedModel,
    tokens: np.ndarray,
    token_bytes: np.ndarray,
    *,
    seq_len: int,
    batch_size: int,
    max_bytes: int = 0,
    vocab_map: VocabMap | None = None,
) -> EvalResult:
    """Score the first ``max_bytes`` of ``tokens`` (global ids) in non-overlapping windows.

    With a ``vocab_map`` (SPEC, TRIM) the model scores local rows, in the softmax it trains
    with (:func:`dept.train.local.next_token_logits`); a target outside V_k gets the "other"
    row's probability split evenly over the ids it stands for, which is what the exported
    model gives each of them.
    """
    device = next(model.parameters()).device
    model.eval()
    tokens = byte_prefix(tokens, token_bytes, max_bytes)
    if len(tokens) < 2:
        raise ValueError(f"the validation text has {len(tokens)} tokens: nothing to score")
    starts = range(0, len(tokens) - 1, seq_len)
    full = [s for s in starts if s + seq_len < len(tokens)]
    batches = [full[i : i + batch_size] for i in range(0, len(full), batch_size)]
    batches += [[s] for s in starts if s + seq_len >= len(tokens)]  # the shorter last window
    nll_nats, count, size = 0.0, 0, 0
    outside_penalty = (
        math.log(vocab_map.num_outside) if vocab_map and vocab_map.num_outside else 0.0
    )
    for group in batches:
        global_ids = np.stack([tokens[s : s + seq_len + 1] for s in group])
        local_ids = vocab_map.to_local(global_ids) if vocab_map else global_ids
        batch = torch.from_numpy(local_ids).to(device, dtype=torch.long)
        with autocast(device):
            logits = next_token_logits(model, batch[:, :-1], vocab_map)
        nll = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
        nll_nats += nll.item()
        if vocab_map is not None:
            nll_nats += outside_penalty * int((local_ids[:, 1:] == vocab_map.other_row).sum())
        count += batch[:, 1:].numel()
        size += int(token_bytes[global_ids[:, 1:]].sum())
    loss = nll_nats / count
    return EvalResult(
        loss, math.exp(min(loss, 50.0)), nll_nats / math.log(2) / max(size, 1), count, size
    )
