"""One data source as a DEPT participant: it trains the shared body with its embeddings.

This is the whole client side of a round, free of Flower: take θ from the server, attach the
embeddings, train N local steps (or, with a time budget, as many as fit:
:class:`dept.train.local.StepBudget`) on the source's stream from where the last round stopped,
store what stays on the node, and return the pseudo-gradient of what is shared, encoded
for the trip up (``compression``; with error feedback, what the last message lost is added).

What comes from the server and what stays on the node is the variant's
(:mod:`dept.model.variants`, :mod:`dept.train.sharing`): θ always travels; φ wholly (GLOB),
by its V_k rows (TRIM, with their ids) or not at all (SPEC, SPEC-OPT: φ_k is created on
first participation and kept); ψ, where the model has learned positions, travels for GLOB
and TRIM and stays with the source for SPEC and SPEC-OPT.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel

from dept.config import DeptConfig
from dept.data.sources import SourceSpec
from dept.data.synthetic import oracle_bpb
from dept.data.token_ids import check_token_ids
from dept.data.token_stream import StreamPosition, TokenizedSource, training_batches
from dept.data.vocab import VocabMap, source_vocabulary, token_byte_lengths
from dept.model.build import build_model
from dept.model.families import position_count
from dept.model.roles import EMBEDDING_NAMES, check_all_loaded, embedding_parameters, load_tensors
from dept.model.variants import variant
from dept.state.workspace import (
    Attempt,
    FoundState,
    SourceState,
    Workspace,
    check_same_device,
    init_embeddings,
    required_state_files,
)
from dept.train.budget import (
    Device,
    check_client_fits,
    check_source_fits,
    embedding_params,
    vocab_key,
)
from dept.train.devices import resolve_device
from dept.train.distributed import round_job, train_on_ranks
from dept.train.evaluate import EvalResult, evaluate_stream
from dept.train.local import (
    RoundResult,
    StepBudget,
    make_inner_optimizer,
    train_local,
)
from dept.train.payload import body_files, round_payload
from dept.train.prepare import prepare_source
from dept.train.ranks import OneProcess
from dept.train.seen_rows import (
    FrozenUntilSeen,
    SeenTokens,
    SentRows,
    row_update_sizes,
    sent_rows,
    zero_unseen,
)
from dept.train.sharing import own_parameters, shared_parameters, shared_state
from dept.wire.fragments import FragmentPlan, HeldBody, start_body

log = logging.getLogger(__name__)


class SourceClient:
    """Everything one source needs for a round; cheap to rebuild, state lives on disk."""

    def __init__(
        self,
        cfg: DeptConfig,
        spec: SourceSpec,
        workspace: Workspace,
        all_sources: list[SourceSpec] | None = None,
        global_tokenizer_file: Path | None = None,
    ) -> None:
        self.cfg, self.spec, self.ws = cfg, spec, workspace
        self.variant = variant(cfg.variant)
        self.device = resolve_device(cfg.device)
        device = Device.here(self.device.type)
        check_source_fits(cfg, spec, device)  # before any real work
        prepared = prepare_source(cfg, spec, workspace.cache, all_sources, global_tokenizer_file)
        text, self.tokenizer = prepared.text, prepared.tokenizer
        self.tokenizer_file = prepared.tokenizer_file
        self.tokenizer_digest = prepared.tokenizer_digest
        self.tokens: TokenizedSource = prepared.tokens
        check_token_ids(spec.name, self.tokens, len(self.tokenizer), prepared.tokenizer_file)
        self.token_bytes = token_byte_lengths(self.tokenizer)
        self.vocab_map = self._vocab_map() if self.variant.local_rows else None
        check_client_fits(cfg, self.vocab_size, vocab_key(cfg, spec), device, spec.nproc)
        self.oracle_bpb = oracle_bpb(text.folder) if text.folder else None

    def _vocab_map(self) -> VocabMap:
        ids = self.ws.load_vocab_ids()
        if ids is None:
            ids = source_vocabulary(self.tokens.train, self.tokenizer)
            self.ws.save_vocab_ids(ids)
        return VocabMap(ids, len(self.tokenizer))

    @property
    def vocab_size(self) -> int:
        """Rows of this source's embedding matrix (|V_k| + 1 for SPEC and TRIM)."""
        if self.variant.embeddings == "all":
            return self.cfg.global_vocab_size
        return self.vocab_map.local_vocab_size if self.vocab_map else len(self.tokenizer)

    @property
    def shared_ids(self) -> np.ndarray | None:
        """TRIM: the global φ rows this source holds (V_k, sorted); None for other variants."""
        rows = self.variant.embeddings == "rows"
        return self.vocab_map.kept_ids if rows and self.vocab_map else None

    def _shared_rows(self) -> int:
        """How many leading rows of this source's φ come from (and go back to) the server."""
        if self.variant.embeddings == "all":
            return self.vocab_size
        ids = self.shared_ids
        return len(ids) if ids is not None else 0

    def model(
        self, arrays: dict[str, torch.Tensor], state: SourceState | None, announce: bool = True
    ) -> PreTrainedModel:
        """θ (and ψ, φ rows where shared) from the server plus this node's own φ_k and ψ_k
        from ``state`` (freshly initialised, seeded by source name, before its first round).
        ``announce``: log where φ_k came from (the app asks once per source and node life)."""
        model = build_model(
            self.cfg.model,
            self.vocab_size,
            self.cfg.seq_len,
            tie_embeddings=self.cfg.tie_embeddings,
            seed=self.cfg.seed,
            device=self.device,
            activation_checkpointing=self.cfg.activation_checkpointing,
            initialise=False,  # every parameter is loaded below (check_all_loaded)
        )
        embeddings = embedding_parameters(model)
        whole = {
            k: p for k, p in shared_parameters(model, self.variant).items() if k not in embeddings
        }
        load_tensors(whole, {k: v for k, v in arrays.items() if k not in embeddings}, "shared")
        kept = own_parameters(model, self.variant)
        if kept:
            own = state.embeddings if state is not None else self._initial_embeddings(kept)
            load_tensors(kept, own, f"source {self.spec.name!r}'s saved")
            if announce:  # in the node's log: did a returning node find its embeddings?
                origin = f"from the state of round {state.server_round}" if state else "fresh"
                log.info("%s: embeddings %s (%s)", self.spec.name, origin, self.ws.dir)
        shared = self._shared_rows()
        with torch.no_grad():
            for name, param in embeddings.items():
                if shared:
                    param[:shared].copy_(arrays[name])
        whole_rows = [p for p in embeddings.values() if shared >= p.shape[0]]
        check_all_loaded(model, [*whole.values(), *kept.values(), *whole_rows])
        return model

    def state(
        self,
        before_round: int,
        attempt: Attempt | None = None,
        consume: bool = False,
        last_trained: int | None = None,
    ) -> FoundState:
        """The source's newest usable state before ``before_round``, of the tokenizer in use
        (another is an error, not damage); ``consume``: training changes its tensors in place.

        With ``last_trained`` (the last round the server took this source's update from, -1
        for none), no state after that round: a round the node trained but the server never
        took (its reply lost, late or refused) is passed over, so the source goes on from
        where the server's view of it stands, as a run without that round would."""
        if last_trained is not None:
            before_round = min(before_round, last_trained + 1)
        found = self.ws.load_state(before_round, attempt, required_state_files(self.cfg), consume)
        if found.state is not None and found.state.tokenizer != self.tokenizer_digest:
            raise ValueError(
                f"source {self.spec.name!r}: the state in {self.ws.dir} was trained for another "
                f"tokenizer ({found.state.tokenizer}, now {self.tokenizer_digest}); the source's "
                "data or vocab-size changed within the run"
            )
        return found

    def state_event(self, found: FoundState, server_round: int, last_trained: int | None) -> str:
        """What to report of the state used in ``server_round`` ("" when it is the one the
        server expects: that of ``last_trained``, the source's last trained round, -1 for
        none). A lost or damaged state is never silent: the source starts fresh, or from an
        older round, and says so."""
        state, why = found.state, "; ".join(found.unusable)
        last_trained = -1 if last_trained is None else last_trained
        what = "embeddings" if self.variant.keeps_state else "optimizer state and position"
        if state is None and (last_trained >= 0 or why):
            event = f"fresh {what} in round {server_round}: state lost ({why or 'no saved state'})"
        elif state is not None and state.server_round < last_trained:
            event = (
                f"{what} from the state of round {state.server_round} in round {server_round}, "
                f"not round {last_trained}'s ({why or 'its state is missing'})"
            )
        else:
            return ""
        log.warning("%s: %s (%s)", self.spec.name, event, self.ws.dir)
        return event

    def _initial_embeddings(self, own: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
        shapes = {k: tuple(p.shape) for k, p in own.items()}
        return init_embeddings(shapes, self.cfg.seed, self.spec.name)  # type: ignore[arg-type]

    def embedding_params(self) -> int:
        """Embedding parameters that live with this source: its φ rows, and ψ_k where its
        learned positions stay home (shared positions count with the body)."""
        phi = embedding_params(self.cfg, self.vocab_size)
        own_positions = not self.variant.shares_positions
        return phi + (position_count(self.cfg.model, self.cfg.seq_len) if own_positions else 0)

    def train_round(
        self,
        arrays: dict[str, torch.Tensor],
        global_step: int,
        server_round: int,
        attempt: Attempt | None = None,
        last_trained: int | None = None,
        announce: bool = True,
        ranks: OneProcess | None = None,
        fragments: FragmentPlan | None = None,
    ) -> RoundResult:
        """Train round ``server_round`` from θ in ``arrays``; ``last_trained`` is the round
        the server last took an update of this source from (-1: none; None: not known, the
        newest state is taken). With ``fragments``
        (partial synchronisation) ``arrays`` may hold only some of θ: the rest comes from
        the node's own body, and only the synced fragments' Δ goes up. A source with
        ``nproc`` > 1 trains on that many processes, each of which calls this with its
        ``ranks`` (:mod:`dept.train.distributed`). With ``drift-eval`` the source's own model
        after its local steps is also scored on its validation text (:meth:`local_score`),
        once, by the call that was not handed ``ranks``."""
        drift = ranks is None and self.cfg.drift_eval
        if ranks is None and self.spec.nproc > 1:
            if fragments is not None:
                raise ValueError(f"source {self.spec.name!r}: fragments > 1 needs nproc = 1")
            result = self._train_on_ranks(
                arrays, global_step, server_round, attempt, last_trained, announce
            )
            return self._with_drift(result, arrays, server_round, attempt) if drift else result
        ranks = ranks or OneProcess()
        # 1. the source's state of the last round the server took, and its model: θ as sent
        #    with the node's own φ_k (AdamW's moments change in place: consumed)
        found = self.state(server_round, attempt, consume=True, last_trained=last_trained)
        event = self.state_event(found, server_round, last_trained)
        state = found.state
        check_same_device(self.cfg, self.spec.name, state, self.device.type)
        base, start = self._start(arrays, state, fragments)
        model = self.model(start, state, announce)
        trained = ranks.wrap(model)
        optimizer = make_inner_optimizer(model, self.cfg)  # after wrap: FSDP shards in place
        if state is not None and state.optimizer is not None and self.cfg.keep_inner_optimizer:
            ranks.load_optimizer(optimizer, state.optimizer)
        # 2. the local steps, on the source's stream from where its last round stopped
        position = replace(state.position) if state is not None else StreamPosition()
        seen = SeenTokens(self.vocab_size) if self.variant.shares_embeddings else None
        stats = train_local(
            trained,
            optimizer,
            ranks.shard(self._batches(position, seen)),
            self.cfg,
            start_step=global_step,
            desc=f"round {server_round} {self.spec.name}",
            after_step=self._freeze_unseen(model, seen),
            budget=StepBudget.of(self.cfg),  # round-time-s: as many steps as fit
            agree=ranks.agree,
            vocab_map=self.vocab_map,
        )
        stats = ranks.reduce(stats)
        ranks.unshard(model)
        # 3. Δ, and what of it travels: the φ rows (embedding-rows), compressed with error
        #    feedback, a fragment's share
        local = shared_state(model, self.variant, self._shared_rows())
        delta = {name: base[name].float() - local[name] for name in base}
        update, rows = self._sent_update(delta, seen)
        payload, residual = self._payload(
            update, state, base, global_step, fragments, server_round=server_round, rows=rows
        )
        # 4. the state the source's next round starts from (every rank gathers the moments:
        #    FSDP's are shards)
        kept = ranks.optimizer_state(optimizer) if self.cfg.keep_inner_optimizer else None
        if ranks.writes:
            self.ws.save_state(
                server_round,
                SourceState(
                    server_round,
                    dict(own_parameters(model, self.variant)),
                    kept,
                    position,
                    self.tokenizer_digest,
                    attempt.id if attempt else "",
                    residual,
                    self.device.type,
                    body_files(base, local) if fragments else {},
                    fragments.versions if fragments else (),
                ),
                base=state.server_round if state is not None else None,
            )
        result = RoundResult(delta, payload, stats, event, metrics=self._row_sizes(delta, seen))
        return self._with_drift(result, base, server_round, attempt) if drift else result

    def _batches(self, position: StreamPosition, seen: SeenTokens | None) -> Iterator[np.ndarray]:
        """The source's training batches from ``position`` on (advancing it), in local rows
        where it has a V_k, each counted into ``seen`` as it is handed out (on every rank,
        whole, before its share is cut)."""
        batches = training_batches(
            self.tokens.train, self.cfg.seq_len, self.cfg.batch_size, self.cfg.seed, position
        )
        if self.vocab_map is not None:
            batches = (self.vocab_map.to_local(b) for b in batches)
        return seen.watch(batches) if seen is not None else batches

    def _freeze_unseen(
        self, model: PreTrainedModel, seen: SeenTokens | None
    ) -> FrozenUntilSeen | None:
        """``unseen-rows=freeze`` (with ``embedding-rows=seen``): the step hook that keeps
        the shared rows no batch has held yet where the round started them."""
        if seen is None or self.cfg.embedding_rows != "seen" or self.cfg.unseen_rows != "freeze":
            return None
        return FrozenUntilSeen(embedding_parameters(model), self._shared_rows(), seen)

    def _sent_update(
        self, delta: dict[str, torch.Tensor], seen: SeenTokens | None
    ) -> tuple[dict[str, torch.Tensor], SentRows | None]:
        """(the update that goes up, the φ rows it carries where not all of φ) under
        ``embedding-rows``: ``seen-zero-filled`` zeroes the rows the round did not see."""
        if seen is None:
            return delta, None
        if self.cfg.embedding_rows == "seen-zero-filled":
            phi = {n: v for n, v in delta.items() if n in EMBEDDING_NAMES}
            delta = delta | zero_unseen(phi, seen.seen(self._shared_rows()))
        return delta, sent_rows(self.variant, self.cfg.embedding_rows, self.shared_ids, seen)

    def _row_sizes(
        self, delta: dict[str, torch.Tensor], seen: SeenTokens | None
    ) -> dict[str, float]:
        """The φ update's size over the shared rows the round saw and over the rest."""
        if seen is None:
            return {}
        phi = {n: v for n, v in delta.items() if n in EMBEDDING_NAMES}
        return row_update_sizes(phi, seen.seen(self._shared_rows()))

    def _start(
        self,
        arrays: dict[str, torch.Tensor],
        state: SourceState | None,
        plan: FragmentPlan | None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(base, start): what Δ is taken against (the whole current global θ, and φ where
        shared), and what training starts from; both ``arrays`` but with fragments, where
        they are rebuilt with the node's own body (:func:`dept.wire.fragments.start_body`)."""
        if plan is None:
            return arrays, arrays
        phi = {n: v for n, v in arrays.items() if n in EMBEDDING_NAMES}
        held = None
        if state is not None and state.body:
            local, base = (
                {n.removeprefix(p): v for n, v in state.body.items() if n.startswith(p)}
                for p in ("local/", "base/")
            )
            held = HeldBody(local, base, state.body_versions)
        body = {n: v for n, v in arrays.items() if n not in phi}
        base, start = start_body(body, held, plan)
        return base | phi, start | phi

    def _with_drift(
        self,
        result: RoundResult,
        arrays: dict[str, torch.Tensor],
        server_round: int,
        attempt: Attempt | None,
    ) -> RoundResult:
        result.local_val_bpb = self.local_score(arrays, result.delta, server_round, attempt)
        return result

    def _train_on_ranks(
        self,
        arrays: dict[str, torch.Tensor],
        global_step: int,
        server_round: int,
        attempt: Attempt | None,
        last_trained: int | None,
        announce: bool,
    ) -> RoundResult:
        """:meth:`train_round` on ``nproc`` processes, launched from here."""
        job = round_job(
            self.cfg,
            self.spec,
            self.ws,
            self.tokenizer_file,
            self.device,
            global_step=global_step,
            server_round=server_round,
            attempt=attempt,
            last_trained=last_trained,
            announce=announce,
        )
        done = train_on_ranks(job, arrays, self.ws)
        return RoundResult(
            done.delta, done.payload, done.stats, done.state_event, metrics=done.metrics
        )

    def _payload(
        self,
        delta: dict[str, torch.Tensor],
        state: SourceState | None,
        arrays: dict[str, torch.Tensor],
        global_step: int,
        plan: FragmentPlan | None = None,
        *,
        server_round: int,
        rows: SentRows | None = None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(what travels for ``delta``, what the next round adds back): :func:`round_payload`."""
        residual = state.residual if state is not None else {}
        return round_payload(
            self.cfg, delta, residual, arrays, global_step, plan, server_round, rows
        )

    def local_score(
        self,
        arrays: dict[str, torch.Tensor],
        delta: dict[str, torch.Tensor],
        server_round: int,
        attempt: Attempt | None = None,
    ) -> float:
        """Bits per byte of the source's own model at the end of ``server_round``'s local
        steps, before the server averages it: θ_local = θ_global − Δ with the state the round
        saved; the same text and code as :meth:`evaluate`, so the two compare alike."""
        local = {name: arrays[name].float() - delta[name] for name in arrays}
        state = self.state(server_round + 1, attempt).state
        return self._score(self.model(local, state, announce=False)).bits_per_byte

    def _score(self, model: PreTrainedModel) -> EvalResult:
        return evaluate_stream(
            model,
            self.tokens.validation,
            self.token_bytes,
            seq_len=self.cfg.seq_len,
            batch_size=self.cfg.eval_batch_size,
            max_bytes=self.cfg.eval_bytes,
            vocab_map=self.vocab_map,
        )

    def evaluate(
        self,
        arrays: dict[str, torch.Tensor],
        server_round: int,
        attempt: Attempt | None = None,
        last_trained: int | None = None,
        announce: bool = True,
    ) -> tuple[EvalResult, str]:
        """Score the validation text with θ and the state as of the end of ``server_round``;
        also what to report of that state (:meth:`state_event`)."""
        found = self.state(server_round + 1, attempt, last_trained=last_trained)
        event = self.state_event(found, server_round, last_trained)
        return self._score(self.model(arrays, found.state, announce)), event
