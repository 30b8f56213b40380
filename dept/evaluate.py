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

from dept.data import block, num_blocks
from dept.train import autocast
from dept.vocab import VocabMap


@dataclass
class EvalResult:
    loss: float  # mean NLL per token, nats
    perplexity: float
    bits_per_byte: float
    tokens: int
    bytes: int


@torch.no_grad()
def evaluate_stream(
    model: PreTrainedModel,
    tokens: np.ndarray,
    token_bytes: np.ndarray,
    *,
    seq_len: int,
    batch_size: int,
    max_tokens: int = 0,
    vocab_map: VocabMap | None = None,
) -> EvalResult:
    """Score ``tokens`` (global ids) in non-overlapping windows, up to ``max_tokens`` targets.

    With a ``vocab_map`` (SPEC) the model scores local rows; a target outside V_k gets the
    "other" row's probability split evenly over the ids it stands for.
    """
    device = next(model.parameters()).device
    model.eval()
    n = num_blocks(tokens, seq_len)
    if max_tokens:
        n = min(n, max(1, max_tokens // seq_len))
    if n < 1:
        raise ValueError(
            f"the validation text has {len(tokens)} tokens: too few for seq-len {seq_len}"
        )
    nll_nats, count, size = 0.0, 0, 0
    outside_penalty = (
        math.log(vocab_map.num_outside) if vocab_map and vocab_map.num_outside else 0.0
    )
    for start in range(0, n, batch_size):
        global_ids = np.stack(
            [block(tokens, i, seq_len) for i in range(start, min(n, start + batch_size))]
        )
        local_ids = vocab_map.to_local(global_ids) if vocab_map else global_ids
        batch = torch.from_numpy(local_ids).to(device, dtype=torch.long)
        with autocast(device):
            logits = model(input_ids=batch[:, :-1]).logits
        nll = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
        nll_nats += nll.item()
        if vocab_map is not None:
            nll_nats += outside_penalty * int((local_ids[:, 1:] == vocab_map.other_row).sum())
        count += batch[:, 1:].numel()
        size += int(token_bytes[global_ids[:, 1:]].sum())
    loss = nll_nats / count
    return EvalResult(
        loss, math.exp(min(loss, 50.0)), nll_nats / math.log(2) / max(size, 1), count, size
    )
