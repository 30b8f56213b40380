"""Thin Flower handlers: unpack the Message, call :class:`dept.source_client.SourceClient`, reply.

``arrays`` in a train or evaluate message hold θ, plus φ for GLOB and φ's V_k rows for
TRIM (float32); a train reply holds their pseudo-gradients, encoded as ``compression`` says
(:mod:`dept.compression`), and for TRIM the ids of the rows.

A failure (bad node config, unreadable data, NaN loss) becomes an error reply whose reason
names the source and the problem, so it reaches the server log and the round goes on.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from collections.abc import Callable

import datasets
import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from client_app.node import node_setup, served_sources
from dept import keys
from dept.config import load_config
from dept.devices import describe, unused_gpus_warning
from dept.logs import drop_misleading_notices, route_to
from dept.source_client import SourceClient
from dept.workspace import Attempt, Workspace

log = logging.getLogger(__name__)
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
# context.state: the sources this node has said where their embeddings came from. It lives
# as long as the SuperNode (across rounds, in simulation and deployment), so a node says it
# once per source and run, and again after a restart: what a returning node found.
ANNOUNCED = "announced"
app = ClientApp()


def _client(msg: Message, context: Context) -> SourceClient:
    """The source the server addressed, set up from this node's config and state."""
    config = msg.content.config_records[keys.CONFIG]
    run_id = str(config[keys.RUN_ID])
    if not RUN_ID_PATTERN.fullmatch(run_id):  # it becomes a folder name on this node
        raise ValueError(f"refusing run id {run_id!r}: expected 1-64 letters, digits, '-' or '_'")
    return _set_up(
        run_id,
        str(config[keys.SOURCE]),
        json.dumps(dict(context.run_config), sort_keys=True),
        json.dumps(dict(context.node_config), sort_keys=True),
    )


@functools.lru_cache(maxsize=32)
def _set_up(run_id: str, source: str, run_config: str, node_config: str) -> SourceClient:
    """Built once per process for a run and source: text, tokenizer, tokens and V_k do not
    change within a run, while everything that does (φ_k, optimizer, position) is read from
    the node's state directory on every call, so a cached client is never stale."""
    cfg = load_config(json.loads(run_config))
    setup = node_setup(cfg, json.loads(node_config), source)
    if setup.device:
        cfg = dataclasses.replace(cfg, device=setup.device)
    workspace = Workspace(setup.state_root, run_id, setup.spec.name)
    return SourceClient(cfg, setup.spec, workspace, setup.all_sources, setup.global_tokenizer)


def _announce(context: Context, client: SourceClient) -> bool:
    """Whether this is the node's first call as ``client``'s source (:data:`ANNOUNCED`);
    then it says where the source trains, warning where this machine's GPUs go unused."""
    first = _first_call(context, client.spec.name)
    if first:
        log.info("%s: trains on %s", client.spec.name, describe(client.device))
        unused = unused_gpus_warning(client.device)
        if unused:
            log.warning("%s: %s", client.spec.name, unused)
    return first


def _reply_or_error(msg: Message, context: Context, handler: Callable[[], RecordDict]) -> Message:
    route_to("flwr")
    drop_misleading_notices("flwr")
    datasets.disable_progress_bars()
    try:
        content = handler()
    except Exception as exc:  # reported to the server as an error reply, never dropped
        config = msg.content.config_records.get(keys.CONFIG)
        source = config.get(keys.SOURCE) if config is not None else None
        source = source or context.node_config.get("source")
        partition = context.node_config.get("partition-id")
        who = f"source {source!s}" if source else f"partition {partition!s}"
        log.exception("%s failed", who)
        reason = f"{who}: {type(exc).__name__}: {exc}"
        return Message(
            Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg
        )
    return Message(content, reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Discovery: which sources this node serves (data paths checked)."""

    def run() -> RecordDict:
        config = msg.content.config_records[keys.CONFIG]
        if config.get(keys.REQUEST) == keys.VOCABULARY:
            client = _client(msg, context)
            ids = client.shared_ids
            if ids is None:
                raise ValueError(f"variant {client.variant.name!r} shares no embedding rows")
            info = ConfigRecord({keys.SOURCE: client.spec.name})
            arrays = ArrayRecord({keys.EMBEDDING_IDS: Array(ids.astype(np.int32))})
            return RecordDict({keys.ARRAYS: arrays, keys.INFO: info})
        served, _ = served_sources(load_config(context.run_config), dict(context.node_config))
        return RecordDict({keys.INFO: ConfigRecord({keys.SOURCES: [s.name for s in served]})})

    return _reply_or_error(msg, context, run)


def _last_trained(config: ConfigRecord) -> int:
    return int(config.get(keys.LAST_TRAINED, -1))  # type: ignore[arg-type]


def _info(client: SourceClient, state_event: str) -> ConfigRecord:
    return ConfigRecord({keys.SOURCE: client.spec.name, keys.STATE_EVENT: state_event})


def _attempt(config: ConfigRecord) -> Attempt:
    return Attempt(
        str(config.get(keys.ATTEMPT, "")),
        int(config.get(keys.RESUMED_AFTER, -1)),  # type: ignore[arg-type]
    )


def _first_call(context: Context, source: str) -> bool:
    """Whether this node acts as ``source`` for the first time (:data:`ANNOUNCED`; noted)."""
    if ANNOUNCED not in context.state.config_records:
        context.state[ANNOUNCED] = ConfigRecord()
    announced = context.state.config_records[ANNOUNCED]
    first = source not in announced
    announced[source] = True
    return first


def _shared(msg: Message) -> dict:
    """θ, and ψ, φ or φ's rows where the variant shares them."""
    return msg.content.array_records[keys.ARRAYS].to_torch_state_dict()


@app.train()
def train(msg: Message, context: Context) -> Message:
    def run() -> RecordDict:
        client = _client(msg, context)
        config = msg.content.config_records[keys.CONFIG]
        received = msg.content.array_records[keys.ARRAYS].count_bytes()
        first = _announce(context, client)
        result = client.train_round(
            _shared(msg),
            int(config[keys.GLOBAL_STEP]),  # type: ignore[arg-type]
            int(config[keys.SERVER_ROUND]),  # type: ignore[arg-type]
            _attempt(config),
            _last_trained(config),
            announce=first,
        )
        arrays = ArrayRecord(result.payload)  # compressed as configured; ids stay int32
        if client.shared_ids is not None:
            arrays[keys.EMBEDDING_IDS] = Array(client.shared_ids.astype(np.int32))
        metrics = MetricRecord(
            {
                keys.NUM_EXAMPLES: result.stats.tokens,
                keys.TRAIN_LOSS: result.stats.mean_loss,
                keys.TRAIN_FINAL_LOSS: result.stats.final_loss,
                keys.TRAIN_SECONDS: result.stats.seconds,
                keys.TOKENS_PER_S: result.stats.tokens_per_s,
                keys.LOCAL_STEPS: result.stats.steps,
                keys.BYTES_RECEIVED: received,
                keys.BYTES_SENT: arrays.count_bytes(),
                keys.EMBEDDING_PARAMS: client.embedding_params(),
            }
        )
        if result.local_val_bpb is not None:  # drift-eval: the score before averaging
            metrics[keys.LOCAL_VAL_BPB] = result.local_val_bpb
        info = _info(client, result.state_event)
        return RecordDict({keys.ARRAYS: arrays, keys.METRICS: metrics, keys.INFO: info})

    return _reply_or_error(msg, context, run)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    def run() -> RecordDict:
        client = _client(msg, context)
        config = msg.content.config_records[keys.CONFIG]
        first = _announce(context, client)
        result, state_event = client.evaluate(
            _shared(msg),
            int(config[keys.SERVER_ROUND]),  # type: ignore[arg-type]
            _attempt(config),
            _last_trained(config),
            announce=first,
        )
        metrics = MetricRecord(
            {
                keys.NUM_EXAMPLES: result.tokens,
                keys.VAL_LOSS: result.loss,
                keys.VAL_PPL: result.perplexity,
                keys.VAL_BPB: result.bits_per_byte,
                keys.VAL_TOKENS: result.tokens,
                keys.VAL_BYTES: result.bytes,
                keys.EMBEDDING_PARAMS: client.embedding_params(),
                keys.ORACLE_BPB: client.oracle_bpb if client.oracle_bpb is not None else -1.0,
            }
        )
        return RecordDict({keys.METRICS: metrics, keys.INFO: _info(client, state_event)})

    return _reply_or_error(msg, context, run)
