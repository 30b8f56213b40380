"""Thin Flower handlers: unpack the Message, call :class:`dept.source_client.SourceClient`, reply.

A failure (bad node config, unreadable data, NaN loss) becomes an error reply whose reason
names the source and the problem, so it reaches the server log and the round goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import datasets
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app.node import node_setup
from dept.config import load_config
from dept.logs import route_to
from dept.source_client import SourceClient
from dept.workspace import Workspace
from dept_strategy import keys

log = logging.getLogger(__name__)
CLIENT_APP_RAISED_EXCEPTION = 2  # flwr.common.constant.ErrorCode
app = ClientApp()


def _client(msg: Message, context: Context) -> SourceClient:
    route_to("flwr")
    datasets.disable_progress_bars()
    cfg = load_config(context.run_config)
    setup = node_setup(cfg, dict(context.node_config))
    run_id = str(msg.content.config_records[keys.CONFIG][keys.RUN_ID])
    workspace = Workspace(setup.state_root, run_id, setup.spec.name)
    context.state[keys.INFO] = ConfigRecord(
        {keys.SOURCE: setup.spec.name, "state-dir": str(workspace.dir)}
    )
    return SourceClient(cfg, setup.spec, workspace, setup.all_sources, setup.global_tokenizer)


def _reply_or_error(
    msg: Message, context: Context, handler: Callable[[SourceClient], RecordDict]
) -> Message:
    try:
        client = _client(msg, context)
        source = client.spec.name
        content = handler(client)
    except Exception as exc:  # reported to the server as an error reply, never dropped
        node = context.node_config.get("source") or context.node_config.get("partition-id")
        log.exception("node %s failed", node)
        return Message(
            Error(
                code=CLIENT_APP_RAISED_EXCEPTION, reason=f"node {node}: {type(exc).__name__}: {exc}"
            ),
            reply_to=msg,
        )
    content[keys.INFO] = ConfigRecord({keys.SOURCE: source})
    return Message(content, reply_to=msg)


def _body(msg: Message) -> dict:
    return msg.content.array_records[keys.ARRAYS].to_torch_state_dict()


@app.train()
def train(msg: Message, context: Context) -> Message:
    def run(client: SourceClient) -> RecordDict:
        config = msg.content.config_records[keys.CONFIG]
        received = msg.content.array_records[keys.ARRAYS].count_bytes()
        result = client.train_round(
            _body(msg), int(config[keys.GLOBAL_STEP]), int(config[keys.SERVER_ROUND])
        )
        arrays = ArrayRecord(result.delta)
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
        return RecordDict({keys.ARRAYS: arrays, keys.METRICS: metrics})

    return _reply_or_error(msg, context, run)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    def run(client: SourceClient) -> RecordDict:
        result = client.evaluate(_body(msg))
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
        return RecordDict({keys.METRICS: metrics})

    return _reply_or_error(msg, context, run)
