"""Thin Flower handlers: unpack the Message, have the node's work done, reply.

The work itself is :mod:`client_app.tasks`. In a deployment every message starts a fresh
``flwr-clientapp`` process, so the work goes to the node's warm worker
(:mod:`client_app.warm`), which keeps torch imported and the source built across messages;
this module then imports neither. In simulation a Ray actor already lives across messages
and the work runs here, in process; node-config ``warm-worker=false`` (or ``true``) decides
it explicitly.

A failure (bad node config, unreadable data, NaN loss, a worker that died) becomes an error
reply whose reason names the source and the problem, so it reaches the server log and the
round goes on.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from client_app.channel import EVALUATE, QUERY, TRAIN, RemoteError
from client_app.cpu_share import use_cpu_share
from client_app.warm import WARM_KEY, WarmWorker
from dept.logs import drop_misleading_notices, route_to
from dept.paths import state_root
from dept.state.disks import disk_note, no_space
from dept.wire import keys

log = logging.getLogger(__name__)
# context.state: the sources this node has said where their embeddings came from. It lives
# as long as the SuperNode (across rounds, in simulation and deployment), so a node says it
# once per source and run, and again after a restart: what a returning node found.
ANNOUNCED = "announced"
# The process Flower 1.42 runs each deployment message in (one per message).
DEPLOYMENT_PROCESS = "flwr-clientapp"
# Deployment only, read by benchmarks/overhead/message_overhead.py: when the handler got the message
# (its process started AGE s before, which a cold message pays), and when it answered.
ARRIVAL_LINE = "%s: %s in hand %.3f s after its process started"
ANSWER_LINE = "%s: %s answered %.3f s after arrival, %.3f s of it training"
app = ClientApp()


def _deployed() -> bool:
    """Whether this process is a deployment's one-message ClientApp process."""
    return Path(sys.argv[0]).name == DEPLOYMENT_PROCESS


def _first_call(context: Context, source: str) -> bool:
    """Whether this node acts as ``source`` for the first time (:data:`ANNOUNCED`; noted)."""
    if ANNOUNCED not in context.state.config_records:
        context.state[ANNOUNCED] = ConfigRecord()
    announced = context.state.config_records[ANNOUNCED]
    first = source not in announced
    announced[source] = True
    return first


def _warm(node_config: dict) -> bool:
    """Whether this message goes to the node's warm worker: as ``warm-worker`` says, else
    exactly when this is a deployment's one-message process."""
    value = node_config.get(WARM_KEY)
    if value is None:
        return _deployed()
    if str(value).lower() not in ("true", "false"):
        raise ValueError(f"node config key {WARM_KEY!r} must be true or false, not {value!r}")
    return str(value).lower() == "true"


def _work(kind: str, msg: Message, context: Context) -> RecordDict:
    source = _source(msg)
    first = bool(source) and kind != QUERY and _first_call(context, source)
    node_config = dict(context.node_config)
    if _warm(node_config):
        run_config = dict(context.run_config)
        worker = WarmWorker.for_node(node_config, run_config)
        return worker.call(kind, msg.content, first, run_config, node_config)
    from client_app.tasks import Task, run_task  # torch and co., only where work runs here

    use_cpu_share(node_config)
    return run_task(Task(kind, msg.content, context.run_config, node_config, first))


def _reply(kind: str, msg: Message, context: Context) -> Message:
    route_to("flwr")
    drop_misleading_notices("flwr")
    if _deployed():  # elsewhere the process outlives it
        log.info(ARRIVAL_LINE, _source(msg), kind, _process_age())
    try:
        content = _work(kind, msg, context)
    except Exception as exc:  # reported to the server as an error reply, never dropped
        source = _source(msg) or context.node_config.get("source")
        partition = context.node_config.get("partition-id")
        who = f"source {source!s}" if source else f"partition {partition!s}"
        if isinstance(exc, RemoteError):  # the worker logged its traceback
            what = exc.what
            log.error("%s failed: %s", who, what)
        else:
            what = f"{type(exc).__name__}: {exc}"
            log.exception("%s failed", who)
        if no_space(exc):  # which disk, and what is free there, only this node can say
            root = state_root(context.node_config, context.run_config.get("state-dir"))
            what = f"{what} ({disk_note(root)})"
        return Message(
            Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{who}: {what}"),
            reply_to=msg,
        )
    if _deployed():  # elsewhere the process outlives it
        _log_answer_time(kind, msg, content)
    return Message(content, reply_to=msg)


def _log_answer_time(kind: str, msg: Message, content: RecordDict) -> None:
    """How long after its process started (in deployment: the message arrived) the reply
    went, and how much of it the local steps took: the rest is this message's fixed cost
    (``benchmarks/overhead/message_overhead.py`` reads this line)."""
    metrics = content.metric_records.get(keys.METRICS)
    training = float(metrics.get(keys.TRAIN_SECONDS, 0.0)) if metrics else 0.0  # type: ignore[arg-type]
    log.info(ANSWER_LINE, _source(msg), kind, _process_age(), training)


def _source(msg: Message) -> str:
    """The source the server addressed ("" for a node-wide query)."""
    config = msg.content.config_records.get(keys.CONFIG)
    return str(config.get(keys.SOURCE, "")) if config is not None else ""


def _process_age() -> float:
    """Seconds since this process started (Linux ``/proc``; the interpreter's own start
    included, which a cold message pays)."""
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Discovery: which sources this node serves (data paths checked), or a source's V_k."""
    return _reply(QUERY, msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _reply(TRAIN, msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _reply(EVALUATE, msg, context)
