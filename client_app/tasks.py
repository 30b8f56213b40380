"""What a node does for each kind of message, on plain Flower records: the heavy side of the
ClientApp, run in the ClientApp's own process (simulation, ``warm-worker=false``) or in the
node's warm worker (:mod:`client_app.worker`).

``arrays`` in a train or evaluate message hold θ, plus φ for GLOB and φ's V_k rows for
TRIM (float32); a train reply holds their pseudo-gradients, encoded as ``compression`` says
(:mod:`dept.wire.compression`), and where it carries only some φ rows (TRIM, or
``embedding-rows=seen``) their ids and counts (:mod:`dept.train.seen_rows`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import datasets
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from client_app.channel import EVALUATE, QUERY, TRAIN, npy_array
from client_app.node import node_setup, served_sources
from dept.config import load_config
from dept.state.workspace import Attempt, Workspace
from dept.train.devices import cap_gpu_memory, describe, unused_gpus_warning
from dept.train.held_body import received_body
from dept.train.source_client import SourceClient
from dept.wire import keys
from dept.wire.fragments import FragmentPlan

log = logging.getLogger(__name__)
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclasses.dataclass(frozen=True)
class Task:
    """One message's work: what the ClientApp hands over, Flower's ``Context`` left behind."""

    kind: str  # TRAIN, EVALUATE or QUERY
    content: RecordDict
    run_config: Mapping[str, Any]
    node_config: Mapping[str, Any]
    announce: bool  # the node's first call as this source (the app keeps count)


def run_task(task: Task) -> RecordDict:
    """The reply content for ``task``; raises what went wrong."""
    datasets.disable_progress_bars()
    handlers: dict[str, Callable[[Task], RecordDict]] = {
        TRAIN: _train,
        EVALUATE: _evaluate,
        QUERY: _query,
    }
    if task.kind not in handlers:
        raise ValueError(f"unknown task {task.kind!r} (expected one of {', '.join(handlers)})")
    return handlers[task.kind](task)


def _client(task: Task) -> SourceClient:
    """The source the server addressed, set up from this node's config and state."""
    config = task.content.config_records[keys.CONFIG]
    run_id = str(config[keys.RUN_ID])
    if not RUN_ID_PATTERN.fullmatch(run_id):  # it becomes a folder name on this node
        raise ValueError(f"refusing run id {run_id!r}: expected 1-64 letters, digits, '-' or '_'")
    client = _set_up(
        run_id,
        str(config[keys.SOURCE]),
        json.dumps(dict(task.run_config), sort_keys=True),
        json.dumps(dict(task.node_config), sort_keys=True),
    )
    _say_device(client, task.announce)
    return client


def _say_device(client: SourceClient, first: bool) -> None:
    """On the node's first call as ``client``'s source: where it trains, and a warning
    where this machine's GPUs go unused."""
    if not first:
        return
    log.info("%s: trains on %s", client.spec.name, describe(client.device))
    unused = unused_gpus_warning(client.device)
    if unused:
        log.warning("%s: %s", client.spec.name, unused)


@functools.lru_cache(maxsize=32)
def _set_up(run_id: str, source: str, run_config: str, node_config: str) -> SourceClient:
    """Built once per process for a run and source: text, tokenizer, tokens and V_k do not
    change within a run, while everything that does (φ_k, optimizer, position) is read from
    the node's state directory on every call, so a cached client is never stale. A Ray
    actor (simulation) and the warm worker (deployment) live across messages, so this is
    what keeps them warm."""
    cfg = load_config(json.loads(run_config))
    setup = node_setup(cfg, json.loads(node_config), source)
    cfg = setup.own_config(cfg)
    workspace = Workspace(setup.state_root, run_id, setup.spec.name)
    client = SourceClient(cfg, setup.spec, workspace, setup.all_sources, setup.global_tokenizer)
    cap_gpu_memory(client.device, setup.gpu_memory_fraction)
    return client


def _query(task: Task) -> RecordDict:
    """Discovery: which sources this node serves (data paths checked), or a source's V_k."""
    config = task.content.config_records[keys.CONFIG]
    if config.get(keys.REQUEST) == keys.VOCABULARY:
        client = _client(dataclasses.replace(task, announce=False))
        ids = client.shared_ids
        if ids is None:
            raise ValueError(f"variant {client.variant.name!r} shares no embedding rows")
        info = ConfigRecord({keys.SOURCE: client.spec.name})
        arrays = ArrayRecord({keys.EMBEDDING_IDS: npy_array(ids.astype(np.int32))})
        return RecordDict({keys.ARRAYS: arrays, keys.INFO: info})
    served, _ = served_sources(load_config(task.run_config), dict(task.node_config))
    return RecordDict({keys.INFO: ConfigRecord({keys.SOURCES: [s.name for s in served]})})


def _last_trained(config: ConfigRecord) -> int | None:
    """The last round the server took this source's update from (-1: none; None: the
    message does not say)."""
    last = config.get(keys.LAST_TRAINED)
    return None if last is None else int(last)  # type: ignore[arg-type]


def _info(client: SourceClient, state_event: str) -> ConfigRecord:
    return ConfigRecord({keys.SOURCE: client.spec.name, keys.STATE_EVENT: state_event})


def _attempt(config: ConfigRecord) -> Attempt:
    return Attempt(
        str(config.get(keys.ATTEMPT, "")),
        int(config.get(keys.RESUMED_AFTER, -1)),  # type: ignore[arg-type]
    )


def _fragments(config: ConfigRecord) -> FragmentPlan | None:
    """The round's fragment plan (``fragments`` > 1), or None: the whole body syncs."""
    if keys.FRAGMENT_VERSIONS not in config:
        return None
    versions = config[keys.FRAGMENT_VERSIONS]
    sync = config[keys.FRAGMENT_SYNC]
    return FragmentPlan(tuple(map(int, versions)), tuple(map(int, sync)))  # type: ignore[arg-type]


def _shared(content: RecordDict) -> dict:
    """θ, and ψ, φ or φ's rows where the variant shares them."""
    return content.array_records[keys.ARRAYS].to_torch_state_dict()


def _train(task: Task) -> RecordDict:
    client = _client(task)
    config = task.content.config_records[keys.CONFIG]
    received = task.content.array_records[keys.ARRAYS].count_bytes()
    shared = _shared(task.content)
    if keys.BODY_DIGEST in config:  # download-compression: θ̂' from the body the node holds
        kind = client.cfg.download_compression
        body = received_body(client.ws.dir, shared, config, kind)
        if body is None:
            return RecordDict({keys.INFO: ConfigRecord({keys.NEEDS_BODY: True})})
        shared = body
    result = client.train_round(
        shared,
        int(config[keys.GLOBAL_STEP]),  # type: ignore[arg-type]
        int(config[keys.SERVER_ROUND]),  # type: ignore[arg-type]
        _attempt(config),
        _last_trained(config),
        announce=task.announce,
        fragments=_fragments(config),
    )
    payload = {k: npy_array(v.detach().cpu().numpy()) for k, v in result.payload.items()}
    arrays = ArrayRecord(payload)  # compressed as configured; φ's row ids and counts int32
    metrics = MetricRecord(
        {
            **result.metrics,
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


def _evaluate(task: Task) -> RecordDict:
    client = _client(task)
    config = task.content.config_records[keys.CONFIG]
    result, state_event = client.evaluate(
        _shared(task.content),
        int(config[keys.SERVER_ROUND]),  # type: ignore[arg-type]
        _attempt(config),
        _last_trained(config),
        announce=task.announce,
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
