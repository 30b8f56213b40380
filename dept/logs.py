"""Send this project's log records through the handlers of a host logger (Flower's, in the apps).

The core logs with ``logging.getLogger(__name__)`` and configures nothing at import time;
an app calls :func:`route_to` once so its records show where Flower's own lines show.
"""

from __future__ import annotations

import logging

PROJECT_LOGGERS = ("dept", "dept_strategy", "server_app", "client_app", "dept_cli")


def route_to(host: str = "flwr", level: int = logging.INFO) -> None:
    """Give the project's loggers the handlers of ``host`` (idempotent)."""
    handlers = logging.getLogger(host).handlers
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        for handler in handlers:
            if handler not in logger.handlers:
                logger.addHandler(handler)
        logger.propagate = not handlers
