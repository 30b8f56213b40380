"""Every strategy test runs as the ServerApp would."""

import pytest
from flwr.supercore.task_identity import TaskIdentity


@pytest.fixture(autouse=True)
def _as_the_server_app() -> None:
    """Message() reads the sender from the process-wide identity the runtime sets."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
