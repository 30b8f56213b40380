"""The run configuration's schema: every key with its default, its one-line doc (which
``dept run --help`` and the configuration reference show, :func:`dept.config.config_keys`);
the checks across keys that no type can say are in :mod:`dept.config.checks`."""

# ruff: noqa: RUF009  (the schema's defaults are doc() calls: each returns a dataclasses.field)
from __future__ import annotations

from dataclasses import dataclass

from dept.config.checks import check_values
from dept.config.names import (
    AggregationName,
    CompressionName,
    ConfigError,
    DataParallelName,
    DownloadName,
    InnerName,
    OutlierAction,
    ServerMemory,
    doc,
)
from dept.model.outer_optimizers import OUTER_OPTIMIZERS, OuterName
from dept.model.variants import (
    VARIANTS,
    EmbeddingRowsName,
    RowWeightName,
    UnseenRowsName,
    VariantName,
)


@dataclass
class DeptConfig:
    """Every run config key of the app, with its default and doc (see :func:`config_keys`)."""

    variant: VariantName = doc(
        "spec-opt",
        "what leaves a source's node: "
        + ", ".join(f"{v.name} ({v.summary})" for v in VARIANTS.values()),
    )
    model: str = doc(
        "tiny",
        "family:size, e.g. llama:tiny or gpt2:small (dept models lists them with their sizes; "
        "a bare size means llama), or the path of a Hugging Face config.json of such a family",
    )
    tie_embeddings: bool = doc(True, "tie input and output embeddings (untied, φ holds both)")
    embedding_rows: EmbeddingRowsName = doc(
        "seen",
        "glob and trim: which of a source's shared φ rows its reply carries: all (every one, "
        "every round), seen (those of the tokens its round's batches held, with how often; "
        "each row is averaged over the sources that sent it, a row nobody sent stays put), "
        "seen-zero-filled (an ablation: every row, those not seen as a zero update); spec "
        "and spec-opt share no rows",
    )
    embedding_row_weight: RowWeightName = doc(
        "tokens",
        "embedding-rows=seen: a sent row's weight in its average, the tokens its source "
        "trained (as the body's) or the times its token occurred in the source's round",
    )
    unseen_rows: UnseenRowsName = doc(
        "train",
        "embedding-rows=seen: what a source's local training does with the shared rows its "
        "round has not seen yet: train them as any other (they are not sent), or freeze them "
        "until a batch holds their token",
    )
    num_server_rounds: int = doc(3, "federated rounds; >= 1")
    local_steps: int = doc(25, "inner optimizer steps per source and round (N_local); >= 1")
    round_time_s: float = doc(
        0.0,
        "time budget: each source trains as many inner steps as fit in this many seconds of "
        "training per round, at least 1 and at most max-local-steps, instead of local-steps "
        "(0: off); a node's own round-time-s node-config key wins; >= 0",
    )
    max_local_steps: int = doc(
        0,
        "the most inner steps a time-budgeted round takes (0: local-steps, so a budget only "
        "shortens a slow node's round); the server's bounds on an update's size and tokens "
        "cover this many steps; 0 or >= local-steps",
    )
    step_delay_s: float = doc(
        0.0,
        "testing aid: a source sleeps this long after each inner step, as a slower node "
        "would take (a node's own step-delay-s node-config key slows that node only); >= 0",
    )
    seq_len: int = doc(128, "tokens per training sequence (a preset's context length); >= 1")
    batch_size: int = doc(8, "sequences per micro-batch; >= 1")
    grad_accum_steps: int = doc(
        1, "micro-batches per inner step: tokens per step = seq-len x batch-size x this; >= 1"
    )
    activation_checkpointing: bool = doc(
        False,
        "recompute each layer's activations in the backward pass instead of keeping them "
        "(non-reentrant; gradients unchanged): about 1/3 more compute, far less memory at "
        "long seq-len and large batch-size",
    )
    lr: float = doc(
        3e-3,
        "peak inner learning rate of one warmup + cosine schedule over all rounds, driven by "
        "the server's global step; > 0",
    )
    min_lr_ratio: float = doc(0.1, "the schedule ends at lr x this; in [0, 1]")
    warmup_steps: int = doc(
        10,
        "linear warmup steps of that schedule; >= 0, at most num-server-rounds x local-steps "
        "- 1 (a shorter run warms up that long, and logs it)",
    )
    inner_optimizer: InnerName = doc(
        "adamw",
        "a source's local optimizer: adamw (β 0.9, 0.95) or sgd (plain: no momentum, so "
        "no state); both on the lr schedule, with grad-clip and weight-decay",
    )
    weight_decay: float = doc(
        0.1,
        "decoupled weight decay of the inner optimizer, on matrices only: each step takes "
        "lr x this x w off a weight w (for sgd the same as L2, having no momentum); >= 0",
    )
    grad_clip: float = doc(1.0, "max gradient norm of an inner step; 0 disables clipping")
    keep_inner_optimizer: bool = doc(
        True,
        "keep each source's AdamW moments across rounds (on the node's disk); false resets "
        "them every round, as the paper's authors do",
    )
    act_period: int = doc(
        0,
        "the ACT baseline re-initialises the token embeddings every this many steps, never "
        "at the last (0: local-steps, once a round, after its evaluation); >= 0",
    )
    outer_optimizer: OuterName = doc(
        "fedavg",
        "the server's step on the shared tensors, the averaged update as gradient: "
        + ", ".join(f"{r.name} ({r.summary})" for r in OUTER_OPTIMIZERS.values())
        + "; a φ row no sampled source holds (trim) does not move",
    )
    outer_lr: float = doc(
        1.0,
        "outer step size; > 0, at most 2 with fedavg and nesterov, 1 with fedadam (use 1e-3 to "
        "1e-1): beyond, the step overshoots what the clients agreed on",
    )
    outer_momentum: float = doc(
        0.9, "nesterov's momentum, fedadam's β1 (fedavg has none); in [0, 1), > 0 where used"
    )
    compression: CompressionName = doc(
        "none",
        "how each source sends its pseudo-gradient up: none (float32), fp16 (half the bytes), "
        "int8 / int4 / int2 / ternary (codes in [-127, 127] / [-7, 7] / {-1, 0, 1} / {-1, 0, 1}, "
        "packed 1, 2, 4 and 5 to a byte, and one float32 scale per block of 256 values: about "
        "3.9x / 7.8x / 15x / 18.5x fewer bytes; int2 and ternary decode alike), topk (per "
        "tensor the topk-density share of largest values, float16, with int32 indices: 6 bytes "
        "a value kept); for θ going down see download-compression",
    )
    download_compression: DownloadName = doc(
        "none",
        "how θ goes down to a training source: none (float32, the whole body), or the body's "
        "change since the one the node holds in one of compression's codes (fp16 ... ternary); "
        "every node holds the same bits, proved by a digest in every message, and a node that "
        "missed a round or holds another body gets the whole body in float32. int4 sends "
        "about 7.8x fewer bytes down; fragments must be 1",
    )
    compression_error_feedback: bool = doc(
        True,
        "with a lossy compression, a source adds what its last message lost to its next update "
        "(the residual stays in its round state on the node)",
    )
    topk_density: float = doc(
        0.01, "compression topk: the share of each tensor's values sent, in (0, 1]"
    )
    fragments: int = doc(
        1,
        "partial synchronisation: the body cut into this many fragments of contiguous layers "
        "(1 = the whole body every round); each syncs every fragment-period rounds, staggered",
    )
    fragment_period: int = doc(
        1, "fragments > 1: each fragment syncs every this many rounds, in 1..fragments"
    )
    aggregation: AggregationName = doc(
        "mean",
        "how a round's updates are combined: mean (weighted by tokens), trimmed-mean (per "
        "coordinate, the mean without the trim-fraction largest and smallest), median (per "
        "coordinate); the robust rules count each source once and apply to θ and glob's φ; "
        "trim's rows stay the row-wise mean",
    )
    server_memory: ServerMemory = doc(
        "fast",
        "how the server's mean is made: fast folds each reply into a body-sized running mean "
        "as it arrives (one body more beside θ and the outer state while replies come in); "
        "lean folds the mean from the round's spool once the last reply is in (at most one "
        "body more, the round ending later by one read of its replies: for 1.3b bodies on a "
        "small server); the body comes out the same",
    )
    outlier_action: OutlierAction = doc(
        "clip",
        "what becomes of a too-large update (update-norm-factor): clip scales it down to the "
        "round's median size and keeps it, reject drops it; either way the log and "
        "summary.json name its source",
    )
    trim_fraction: float = doc(
        0.2,
        "the share β trimmed-mean drops at each end: ceil(β·n) of n values, at most (n-1)/2; "
        "in (0, 0.5)",
    )
    update_norm_factor: float = doc(
        10.0,
        "an update whose RMS or largest absolute value exceeds this many times the round's "
        "median (the previous round's median votes too) is too large; 0 (off) or > 1; one "
        "beyond what the round's AdamW steps can move a weight is too large regardless; "
        "off under dp-noise-multiplier (it judges an update by the others')",
    )
    flatness_factor: float = doc(
        0.0,
        "an update larger than the round's median RMS whose flatness (RMS over its largest "
        "absolute value) is more than this many times the round's median is a flattened, "
        "signs-only update; outlier-action applies (clip: to the median RMS); 0: off (the "
        "default: a source restarting with a fresh AdamW state sends a flat, large update "
        "too); 2.5 caught every signs-only update in the poisoning runs; off under "
        "dp-noise-multiplier",
    )
    direction_factor: float = doc(
        4.0,
        "an update whose agreement with the round's others (θ: its cosine with their mean, "
        "per tensor, averaged) is negative and more than this many robust deviations below "
        "the round's median points the wrong way (reversed, sign-flipped, colluding); "
        "outlier-action applies; needs 3 updates; 0: off; off under dp-noise-multiplier",
    )
    dp_noise_multiplier: float = doc(
        0.0,
        "central differential privacy on the shared update: each source's update (θ, and "
        "glob's φ) clipped to dp-clip-norm, Gaussian noise of this many times dp-clip-norm "
        "added to their sum, each source counted once; ε in metrics.jsonl; only the reach "
        "check screens updates then; 0: off",
    )
    dp_clip_norm: float = doc(
        1.0, "with dp-noise-multiplier: the L2 norm each source's update is clipped to; > 0"
    )
    dp_delta: float = doc(1e-5, "with dp-noise-multiplier: the δ that ε is accounted at; in (0, 1)")
    fraction_train: float = doc(
        1.0, "share of the sources sampled (uniformly) to train each round; in (0, 1]"
    )
    min_train_nodes: int = doc(
        1, "fewest sources sampled per round (at least 1, at most all); >= 0"
    )
    min_train_replies: int = doc(
        1,
        "fewest usable training replies for a round to change the model; below it the round "
        "leaves θ as it was and says so; >= 1",
    )
    empty_round_retries: int = doc(
        2,
        "a round in which no source trained (each failed, was refused or was silent) is no "
        "round: the model and its checkpoints stay as they were and the round is tried "
        "again, at most this many times in a row; then the run stops with an error naming "
        "the cause (a full disk: the folder and its free space) and how to resume; round 1 "
        "is not tried again (a setup error); >= 0",
    )
    fraction_evaluate: float = doc(
        1.0,
        "share of the sources evaluated after each middle round (0: none); every source is "
        "evaluated before training and after the last round; in [0, 1]",
    )
    min_available_nodes: int = doc(
        0, "nodes to wait for before round 0 (0: any node serving a source); >= 0"
    )
    wait_for_nodes_s: float = doc(
        120.0,
        "seconds to wait for them, then fail saying how many were seen and why nodes could "
        "not serve (sooner when every connected node failed and none joined for 10 s); > 0",
    )
    round_timeout_s: float = doc(
        3600.0,
        "seconds a round waits for replies; later ones are dropped and reported, and the round "
        "aggregates what it got (a first round no source could train stops the run); > 0",
    )
    global_vocab_size: int = doc(
        4096,
        "size of the global tokenizer and rows of the global φ (spec, trim, glob, baselines); "
        "in [300, 1,048,576]",
    )
    eval_bytes: int = doc(
        65536,
        "validation text scored per source, in UTF-8 bytes: the same text whatever the "
        "tokenizer (0: all); >= 0",
    )
    eval_batch_size: int = doc(16, "sequences per evaluation batch; >= 1")
    drift_eval: bool = doc(
        False,
        "each trained source also scores its own local model (before averaging) on its "
        "validation text, for metrics.jsonl's drift: one more evaluation per source and round",
    )
    interference: bool = doc(
        True,
        "record the cosine between every pair of a round's updates (θ, and φ where shared) in "
        "metrics.jsonl: one more read of the round's spooled updates on the server",
    )
    seed: int = doc(0, "seed of body init, embeddings, data order, sampling, synthetic data; >= 0")
    device: str = doc(
        "auto",
        "where sources train and evaluate: auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N "
        "(the N-th visible GPU), mps; a node's own device=... node-config key wins",
    )
    data_parallel: DataParallelName = doc(
        "ddp",
        "how a source with nproc > 1 (a source or node-config key) trains on its processes: "
        "ddp (each holds the whole model, gradients are averaged) or fsdp (FSDP2: weights, "
        "gradients and AdamW moments sharded across them, for a body whose training does "
        "not fit one device)",
    )
    sources_file: str = doc("", "YAML file listing the sources (empty: the built-in default)")
    source_keys_file: str = doc(
        "",
        "YAML mapping source names to OpenSSH public keys (or .pub files): only a node "
        "authenticated with that key may serve the source (needs SuperNode authentication)",
    )
    output_dir: str = doc(
        "outputs/dept",
        "where the run writes metrics, summary, checkpoints, final weights, plot; not empty",
    )
    state_dir: str = doc(
        "",
        "node-local state root (empty: ~/.cache/dept): tokenizers, token caches, each "
        "source's round state (embeddings, AdamW moments, compression residual)",
    )
    resume: bool = doc(False, "continue the run in output-dir after its newest good checkpoint")
    allow_device_change: bool = doc(
        False,
        "let a resumed run train on another device than its checkpointed config names (its "
        "numbers then differ from an uninterrupted run's: bf16 autocast, fused AdamW)",
    )
    tensorboard: bool = doc(
        False,
        "write each round's metrics as TensorBoard scalars under output-dir/tensorboard/ "
        "(needs the tensorboard extra)",
    )
    wandb_project: str = doc(
        "",
        "Weights & Biases project to log each round's metrics to, as a run named by the run "
        "id (empty: off; WANDB_MODE=offline keeps it local; needs the wandb extra)",
    )

    def __post_init__(self) -> None:
        self._check_model()
        check_values(self)

    def _check_model(self) -> None:
        """The ``model`` value names a family's preset or a config file it can build: a
        preset is checked by name (its HF config, built with any ``seq-len``, always holds;
        importing the config class takes seconds), a config file by building its config."""
        from dept.model.families import build_config, model_choice

        try:
            if model_choice(self.model).from_file:
                build_config(self.model, 512, self.seq_len, self.tie_embeddings)
        except ValueError as exc:
            raise ConfigError(f"config key 'model': {exc}") from exc

    @property
    def total_steps(self) -> int:
        """Length of the one global learning-rate schedule (all rounds)."""
        return self.num_server_rounds * self.local_steps

    @property
    def step_cap(self) -> int:
        """The most inner steps any source trains in a round: ``max-local-steps``, or
        ``local-steps`` where it is 0 (a time budget then only shortens rounds)."""
        return self.max_local_steps or self.local_steps

    @property
    def forget_period(self) -> int:
        """ACT's steps between fresh embeddings: ``act-period``, or a round's steps."""
        return self.act_period or self.local_steps

    @property
    def warmup(self) -> int:
        """The warmup the schedule uses: ``warmup-steps``, clamped so that a run shorter than
        it still reaches its peak learning rate (a 2-step run warms up 1 step)."""
        return min(self.warmup_steps, self.total_steps - 1)
