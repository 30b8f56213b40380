"""Mock replies for DeptStrategy tests: a tiny body, a strategy over it, the messages it
sends and the replies a source would give."""

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from dept.wire import keys
from dept_strategy.inflight import Target
from dept_strategy.outer import OuterOptimizer
from dept_strategy.settings import StrategySettings
from dept_strategy.strategy import DeptStrategy

BODY = {"a": torch.ones(2, 3), "b": torch.zeros(4)}


def mock_strategy(**kwargs) -> DeptStrategy:
    """A strategy over :data:`BODY`; ``kwargs``: ``outer`` and :class:`StrategySettings`."""
    outer = kwargs.pop("outer", None) or OuterOptimizer(BODY, kind="fedavg")
    settings = {"local_steps": 5, "run_id": "r", "wait_for_nodes_s": 1.0, **kwargs}
    return DeptStrategy(outer, StrategySettings(**settings))


def instruction_to(strategy: DeptStrategy, node: int, source: str) -> Message:
    """A message the strategy sent (and tracks) to ``node`` for ``source``."""
    msg = Message(RecordDict({keys.CONFIG: ConfigRecord()}), node, "train")
    msg.metadata.__dict__["_message_id"] = f"m{node}-{source}"
    strategy.in_flight.track(msg, Target(node, source))
    return msg


def train_reply(
    strategy: DeptStrategy, node: int, arrays: dict, weight: float, source: str
) -> Message:
    content = RecordDict(
        {
            keys.ARRAYS: ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()}),
            keys.METRICS: MetricRecord(
                {
                    keys.NUM_EXAMPLES: weight,
                    keys.TRAIN_LOSS: 2.0,
                    keys.LOCAL_STEPS: 5,
                    keys.EMBEDDING_PARAMS: 10,
                }
            ),
            keys.INFO: ConfigRecord({keys.SOURCE: source}),
        }
    )
    return Message(content, reply_to=instruction_to(strategy, node, source))


def assert_rows_averaged_over_senders(arrays: ArrayRecord, phi: torch.Tensor) -> None:
    """The φ of a round where s1 sent rows 0, 1 (moved by 1.0, 1 token) and s2 rows 1, 2
    (by 3.0, 3 tokens), from ``phi``: each row the token-weighted mean of its senders', a
    row nobody sent where it was; θ (moved as its φ rows) the mean of both."""
    got = arrays["input"].numpy()
    assert np.allclose(got[0], phi[0] - 1.0), "one sender: its own update, not diluted"
    assert np.allclose(got[1], phi[1] - (1 * 1.0 + 3 * 3.0) / 4), "two: by tokens"
    assert np.allclose(got[2], phi[2] - 3.0)
    assert np.array_equal(got[3:], phi[3:].numpy()), "nobody's: where it was"
    assert np.allclose(arrays["a"].numpy(), 1.0 - (1 * 1.0 + 3 * 3.0) / 4)
