"""The message contract: record and metric names shared by the ServerApp and the ClientApp.

It lives in the core so the client app depends on ``dept`` only, never on the server's package.

One case style (Flower's kebab-case). Every reply of one kind carries the same records:
``arrays`` (train only), ``metrics`` and ``info``.
"""

# Records in a message's RecordDict
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
INFO = "info"

# ConfigRecord keys, server -> client
SERVER_ROUND = "server-round"
GLOBAL_STEP = "global-step"
RUN_ID = "run-id"
ATTEMPT = "attempt"  # this start of the server on the run (a resume is a new attempt)
RESUMED_AFTER = "resumed-after"  # the round the attempt resumed after; -1 for a fresh start
SOURCE = "source"  # which of the node's sources acts (train, evaluate); also in replies' info
LAST_TRAINED = "last-trained-round"  # the last round the server took this source's update; -1
REQUEST = "request"  # what a query asks: absent = which sources; VOCABULARY = V_k of SOURCE
VOCABULARY = "vocabulary"
FRAGMENT_VERSIONS = (
    "fragment-versions"  # fragments > 1: each fragment's version (dept.wire.fragments)
)
FRAGMENT_SYNC = "fragment-sync"  # fragments > 1: the fragments whose Δ the reply carries
# download-compression: the digest of the body a train message makes (dept.wire.download), and
# where it carries a change, of the body the change applies to
BODY_DIGEST = "body-digest"
BASE_DIGEST = "base-digest"

# Array keys besides θ's parameter names (``input``/``output`` are φ, GLOB and TRIM)
EMBEDDING_IDS = "embedding-ids"  # the global φ rows a message holds (TRIM's V_k; seen rows), int32
# embedding-rows=seen: how often each row's token occurred in the source's round, int32
EMBEDDING_COUNTS = "embedding-counts"
# compression int8: "<name>@scale" beside each tensor's codes (dept.wire.compression.SCALE_SUFFIX)

# ConfigRecord keys, client -> server (``info`` of a query reply)
SOURCES = "sources"  # the source names a node serves
# ``info`` of train and evaluate replies: what the source found of its saved state, "" when
# it is the expected one ("fresh embeddings in round 5: state lost (...)")
STATE_EVENT = "state-event"
# ``info`` of a train reply that trained nothing: the node does not hold the body the change
# applies to, and asks for the whole body (the server sends it in the same round)
NEEDS_BODY = "needs-body"

# MetricRecord keys, client -> server
NUM_EXAMPLES = "num-examples"  # tokens trained: the aggregation weight
TRAIN_LOSS = "train-loss"
TRAIN_FINAL_LOSS = "train-final-loss"
TRAIN_SECONDS = "train-seconds"
TOKENS_PER_S = "tokens-per-s"
LOCAL_STEPS = "local-steps"
BYTES_RECEIVED = "bytes-received"
BYTES_SENT = "bytes-sent"
EMBEDDING_PARAMS = "embedding-params"
VAL_LOSS = "val-loss"
VAL_PPL = "val-ppl"
VAL_BPB = "val-bpb"
VAL_TOKENS = "val-tokens"
VAL_BYTES = "val-bytes"
ORACLE_BPB = "oracle-bpb"  # best achievable bits per byte where known, else -1
LOCAL_VAL_BPB = "local-val-bpb"  # train reply (drift-eval): own model before averaging
# train reply, GLOB and TRIM: the φ update's RMS over the shared rows the round saw, and over
# those it did not (moved by the softmax's push-down alone), and how many it saw
EMBEDDING_UPDATE_SEEN_RMS = "embedding-update-seen-rms"
EMBEDDING_UPDATE_UNSEEN_RMS = "embedding-update-unseen-rms"
EMBEDDING_ROWS_SEEN = "embedding-rows-seen"
