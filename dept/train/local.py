"""How a client trains: N local steps (AdamW, or plain SGD) on its own source, on one global
LR schedule.

The learning rate is a function of the *global* step the server sends (warmup, then cosine
to ``min-lr-ratio`` over all rounds), so it does not restart every round.

With a time budget (``round-time-s``, :class:`StepBudget`) a source trains as many steps as
fit in it instead of ``local-steps``. The schedule stays the one global schedule of
``num-server-rounds`` x ``local-steps`` steps, and the step counter works as in a fixed run:
every round starts at the server's global step, (round - 1) x ``local-steps``, and a source's
position advances by one per step it actually trains. A slow node thus skips the end of its
round's stretch of the schedule and a fast one (``max-local-steps`` above ``local-steps``)
runs into the next round's; no source falls behind across rounds, all end at the floor
together, and the LR depends on the step index alone, never on timing, so every process of
a source agrees on it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import PreTrainedModel

from dept.config import DeptConfig
from dept.data.vocab import VocabMap

log = logging.getLogger(__name__)
ADAM_BETAS = (0.9, 0.95)
PROGRESS_EVERY_S = 60.0  # the longest a round goes without a progress line


@dataclass
class TrainStats:
    steps: int
    tokens: int
    mean_loss: float
    final_loss: float
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class StepBudget:
    """How many inner steps a round takes. Fixed (``seconds`` 0): exactly ``steps``. Timed:
    after each step the round goes on while another step as long as the last one still ends
    within ``seconds`` of training, for at least 1 and at most ``steps`` steps, so it ends
    within its budget plus one step. ``delay_s`` (testing aid) is slept after every step, as
    a slower node would take it."""

    steps: int
    seconds: float = 0.0
    delay_s: float = 0.0

    @classmethod
    def of(cls, cfg: DeptConfig) -> StepBudget:
        """A source's round: ``round-time-s`` capped at ``max-local-steps``, or ``local-steps``."""
        if cfg.round_time_s > 0:
            return cls(cfg.step_cap, cfg.round_time_s, cfg.step_delay_s)
        return cls(cfg.local_steps, 0.0, cfg.step_delay_s)

    def go_on(self, done: int, elapsed: float, last: float, agree: Callable[[bool], bool]) -> bool:
        """Whether to train another step after ``done``, ``elapsed`` seconds in (the last
        step took ``last``). A timed round's answer goes through ``agree``, which gives
        every process of a source rank 0's: they each time their own steps, yet must stop
        at the same one (each calls it once a step, so none waits on another in vain)."""
        if self.seconds == 0:
            return done < self.steps
        return agree(done < self.steps and elapsed + last <= self.seconds)


@dataclass
class RoundResult:
    """A source's round: what it moved, what goes up for it, and how it went."""

    delta: dict[str, torch.Tensor]  # θ_global − θ_local, float32 on CPU
    payload: dict[str, torch.Tensor]  # what is sent for it, as compression-encoded
    stats: TrainStats
    state_event: str = ""  # what the source reports of its saved state (:func:`state_event`)
    local_val_bpb: float | None = None  # drift-eval: its own model's score, before averaging
    # what else the reply's metrics say of the round (the φ update over seen and unseen rows)
    metrics: dict[str, float] = field(default_factory=dict)


def lr_at(step: int, cfg: DeptConfig) -> float:
    """Linear warmup to ``lr`` then cosine decay to ``lr * min-lr-ratio`` at the last step,
    ``total_steps - 1`` (steps count from 0); it stays there after (a fast node's extra steps)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.total_steps - 1 - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def adam_step_bound(betas: tuple[float, float] = ADAM_BETAS) -> float:
    """The most one Adam step can move a weight, in units of its learning rate, whatever the
    gradients: |m̂_t / √v̂_t| ≤ this (Cauchy–Schwarz over the two moment sums; reached as
    t → ∞, 1 at t = 1). About 1.165 for β = (0.9, 0.95)."""
    b1, b2 = betas
    return max(1.0, (1 - b1) / math.sqrt((1 - b2) * (1 - b1 * b1 / b2)))


def step_bound(cfg: DeptConfig) -> float:
    """The most one inner step moves a weight, in units of its learning rate, before weight
    decay: Adam's :func:`adam_step_bound` whatever the gradients; SGD's step is the gradient,
    no larger than its clipped norm (unbounded without clipping: ``inf``)."""
    if cfg.inner_optimizer == "adamw":
        return adam_step_bound()
    return cfg.grad_clip if cfg.grad_clip > 0 else math.inf


def max_round_update(cfg: DeptConfig, start_step: int, max_abs_weight: float) -> float:
    """The most one round of local training can move any weight, |θ_global − θ_local|: the
    inner optimizer's reach over the round's learning rates (:func:`step_bound`), plus its
    decoupled weight decay on weights no larger than ``max_abs_weight``. An honest
    pseudo-gradient never exceeds it, so the server can refuse one that does without any
    reference to other replies (``inf``: SGD without clipping can move a weight any way).
    A round is ``step-cap`` steps long at most (a time budget's fast node trains that many)."""
    return _max_update(cfg, [start_step], max_abs_weight)


def max_span_update(cfg: DeptConfig, rounds: range, max_abs_weight: float) -> float:
    """:func:`max_round_update` over the local training of every round in ``rounds``
    together: what a fragment's Δ can hold, trained on since its base
    (:func:`dept.wire.fragments.span`). One round's span is exactly that round's bound."""
    return _max_update(cfg, [round_start_step(cfg, r) for r in rounds], max_abs_weight)


def round_start_step(cfg: DeptConfig, server_round: int) -> int:
    """The global step at which ``server_round``'s training starts (1-based rounds)."""
    return max(server_round - 1, 0) * cfg.local_steps


def _max_update(cfg: DeptConfig, start_steps: list[int], max_abs_weight: float) -> float:
    lr_sum = sum(lr_at(start + step, cfg) for start in start_steps for step in range(cfg.step_cap))
    reach = step_bound(cfg) * lr_sum
    return reach + cfg.weight_decay * lr_sum * (max_abs_weight + reach)


def make_inner_optimizer(model: PreTrainedModel, cfg: DeptConfig) -> torch.optim.Optimizer:
    """``inner-optimizer`` with weight decay on matrices only (not on norms); fused on CUDA.

    SGD has no momentum, so torch's (L2) weight decay, lr·(g + λw), is exactly AdamW's
    decoupled form, w·(1 − lr·λ) − lr·g: one ``weight-decay`` means the same for both."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = next(model.parameters()).device.type == "cuda"
    if cfg.inner_optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=0.0, fused=fused)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=ADAM_BETAS, fused=fused)


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; full precision elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def next_token_logits(
    model: PreTrainedModel, inputs: torch.Tensor, vocab_map: VocabMap | None = None
) -> torch.Tensor:
    """The float32 logits (B, T, V) of the token after each of ``inputs`` (B, T): the one
    softmax a source trains and is scored with.

    With a ``vocab_map`` (SPEC, TRIM: local rows) the "other" row stands for the N_out ids
    outside V_k, so its logit counts N_out times: z_other + log N_out. The softmax over the
    |V_k| + 1 rows is then exactly the one over the whole tokenizer of the exported model,
    where each of those ids carries a copy of the row (:mod:`dept.export`): P(other) is N_out
    times the probability of each of them. Counted once, the row would hold the run's
    measure of the model, and the export's normaliser N_out - 1 more copies of it: every
    kept token loses log(1 + (N_out - 1) p_other) nats there (issue #39).
    """
    logits = model(input_ids=inputs).logits.float()  # (B, T, V)
    if vocab_map is not None:  # in place: a second (B, T, V) tensor would cost its memory
        logits[..., vocab_map.other_row] += vocab_map.other_log_count
    return logits


def next_token_loss(
    model: PreTrainedModel, batch: torch.Tensor, vocab_map: VocabMap | None = None
) -> torch.Tensor:
    """Mean cross-entropy of ``batch[:, 1:]`` given ``batch[:, :-1]``; batch is (B, T+1) (of
    local rows with a ``vocab_map``: :func:`next_token_logits`)."""
    logits = next_token_logits(model, batch[:, :-1], vocab_map)
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def train_local(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[np.ndarray],
    cfg: DeptConfig,
    *,
    start_step: int,
    desc: str,
    after_step: Callable[[int], None] | None = None,
    budget: StepBudget | None = None,
    agree: Callable[[bool], bool] = bool,
    vocab_map: VocabMap | None = None,
) -> TrainStats:
    """Run the optimizer steps of ``budget`` (default: ``cfg.local_steps`` of them), of
    ``cfg.grad_accum_steps`` micro-batches each, step ``i`` on the schedule's step
    ``start_step + i``; ``after_step`` is called with the global count of steps done after
    each (ACT's forgetting); ``agree``: see :meth:`StepBudget.go_on`; ``vocab_map``: the
    source's local rows, which ``batches`` hold (:func:`next_token_logits`).

    Progress counts micro-batches, and a log line goes out every quarter of the round or
    every ``PROGRESS_EVERY_S`` seconds, so even a step of many micro-batches shows it lives.
    """
    budget = budget or StepBudget(cfg.local_steps)
    model.train()
    log.info("%s: %d local steps from global step %d", desc, budget.steps, start_step)
    progress = Progress(cfg, desc, start_step, budget.steps)
    losses: list[float] = []
    local_step, going = 0, True
    while going:
        step_started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(start_step + local_step, cfg)
        loss = _accumulate(model, batches, cfg, progress, local_step, vocab_map)
        step_loss = loss.item()  # one sync
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not math.isfinite(step_loss):
            raise FloatingPointError(f"{desc}: loss became {step_loss} at local step {local_step}")
        losses.append(step_loss)
        progress.step_done(local_step, step_loss, optimizer.param_groups[0]["lr"])
        if after_step is not None:
            after_step(start_step + local_step + 1)
        if budget.delay_s:
            time.sleep(budget.delay_s)
        local_step += 1
        now = time.perf_counter()
        going = budget.go_on(local_step, now - progress.started, now - step_started, agree)
    progress.close()
    tokens, started = progress.tokens, progress.started
    seconds = time.perf_counter() - started
    stats = TrainStats(len(losses), tokens, float(np.mean(losses)), losses[-1], seconds)
    return stats


def _accumulate(
    model: PreTrainedModel,
    batches: Iterator[np.ndarray],
    cfg: DeptConfig,
    progress: Progress,
    local_step: int,
    vocab_map: VocabMap | None,
) -> torch.Tensor:
    """Forward and backward ``cfg.grad_accum_steps`` micro-batches; the step's loss, summed
    on the model's device: reading each micro-batch's loss would make the host wait for the
    GPU every micro-batch, where once a step is enough."""
    device = next(model.parameters()).device
    step_loss = torch.zeros((), device=device)
    for micro in range(cfg.grad_accum_steps):
        batch = torch.from_numpy(next(batches)).to(device, dtype=torch.long, non_blocking=True)
        with gradient_sync(model, micro + 1 == cfg.grad_accum_steps):
            with autocast(device):  # the forward only: backward under autocast is not advised
                loss = next_token_loss(model, batch, vocab_map) / cfg.grad_accum_steps
            loss.backward()
        step_loss += loss.detach()
        progress.micro_batch_done(batch.shape[0] * (batch.shape[1] - 1), local_step, micro)
    return step_loss


def gradient_sync(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Whether this backward exchanges gradients between a source's processes: only the
    last micro-batch of a step does (DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``
    for the others), so a step costs one all-reduce, not ``grad-accum-steps`` of them; the
    gradients the step applies are the same. A model on one process has neither (found by
    name: the training path of every message does not import torch.distributed's wrappers)."""
    set_sync, no_sync = (getattr(model, n, None) for n in ("set_requires_gradient_sync", "no_sync"))
    if set_sync is not None:  # FSDP2
        set_sync(sync)
    elif no_sync is not None and not sync:  # DDP
        return no_sync()
    return contextlib.nullcontext()


class Progress:
    """A round's progress: a bar of micro-batches on a terminal, log lines everywhere."""

    def __init__(
        self, cfg: DeptConfig, desc: str, start_step: int, steps: int | None = None
    ) -> None:
        """``steps``: the round's steps (default ``local-steps``), or the most a
        time-budgeted round can take."""
        steps = steps or cfg.local_steps
        self.cfg, self.desc, self.start_step, self.steps = cfg, desc, start_step, steps
        self.tokens = 0
        self.started = self.last_log = time.perf_counter()
        self.log_every = max(1, steps // 4)
        self.bar = tqdm(
            total=steps * cfg.grad_accum_steps,
            desc=desc,
            unit="batch",
            mininterval=2.0,
            leave=False,
            disable=None,  # a bar on a terminal only
        )

    def tokens_per_s(self) -> float:
        return self.tokens / max(time.perf_counter() - self.started, 1e-9)

    def _due(self) -> bool:
        return time.perf_counter() - self.last_log >= PROGRESS_EVERY_S

    def micro_batch_done(self, tokens: int, local_step: int, micro: int) -> None:
        self.tokens += tokens
        self.bar.update()
        if self._due() and micro + 1 < self.cfg.grad_accum_steps:
            self.last_log = time.perf_counter()
            log.info(
                "%s: step %d/%d, micro-batch %d/%d, %.0f tokens/s",
                self.desc,
                local_step + 1,
                self.steps,
                micro + 1,
                self.cfg.grad_accum_steps,
                self.tokens_per_s(),
            )

    def step_done(self, local_step: int, loss: float, lr: float) -> None:
        self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{self.tokens_per_s():.0f}")
        if (local_step + 1) % self.log_every == 0 or self._due():
            self.last_log = time.perf_counter()
            log.info(
                "%s: step %d/%d (global %d) loss %.4f lr %.2e %.0f tokens/s",
                self.desc,
                local_step + 1,
                self.steps,
                self.start_step + local_step + 1,
                loss,
                lr,
                self.tokens_per_s(),
            )

    def close(self) -> None:
        self.bar.close()
