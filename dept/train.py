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
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import PreTrainedModel

from dept.config import DeptConfig

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


def lr_at(step: int, cfg: DeptConfig) -> float:
    """Linear warmup to ``lr`` then cosine decay to ``lr * min-lr-ratio`` at the last step."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.total_steps - cfg.warmup)
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
    lr_sum = sum(lr_at(start_step + step, cfg) for step in range(cfg.step_cap))
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


def next_token_loss(model: PreTrainedModel, batch: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``batch[:, 1:]`` given ``batch[:, :-1]``; batch is (B, T+1)."""
    logits = model(input_ids=batch[:, :-1]).logits  # (B, T, V)
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


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
) -> TrainStats:
    """Run the optimizer steps of ``budget`` (default: ``cfg.local_steps`` of them), of
    ``cfg.grad_accum_steps`` micro-batches each, step ``i`` on the schedule's step
    ``start_step + i``; ``after_step`` is called with the global count of steps done after
    each (ACT's forgetting); ``agree``: see :meth:`StepBudget.go_on`.

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
        step_loss = _accumulate(model, batches, cfg, progress, local_step).item()  # one sync
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
) -> torch.Tensor:
    """Forward and backward ``cfg.grad_accum_steps`` micro-batches; the step's loss, summed
    on the model's device: reading each micro-batch's loss would make the host wait for the
    GPU every micro-batch, where once a step is enough."""
    device = next(model.parameters()).device
    step_loss = torch.zeros((), device=device)
    for micro in range(cfg.grad_accum_steps):
        batch = torch.from_numpy(next(batches)).to(device, dtype=torch.long, non_blocking=True)
        with autocast(device):
            loss = next_token_loss(model, batch) / cfg.grad_accum_steps
        loss.backward()
        step_loss += loss.detach()
        progress.micro_batch_done(batch.shape[0] * (batch.shape[1] - 1), local_step, micro)
    return step_loss


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
