"""Send this project's log records through the handlers of a host logger (Flower's, in the apps),
and keep out of it the Flower notices that are wrong for this app.

The core logs with ``logging.getLogger(__name__)`` and configures nothing at import time;
an app calls :func:`route_to` and :func:`drop_misleading_notices` once so its records show
where Flower's own lines show, without the noise.
"""

from __future__ import annotations

import logging

PROJECT_LOGGERS = ("dept", "dept_strategy", "server_app", "client_app", "dept_cli")
# Flower notices that mislead in this app: the exact template Flower logs each with (so
# nothing else is ever dropped; a release that rewords one lets it through again), and the
# Flower module that logs it.
MISLEADING_NOTICES = {
    # Every Ray actor logs it as the simulation shuts down, after a good run as after a
    # failed one.
    "Manually terminating %s": "flwr.simulation.ray_transport.ray_actor",
}
# Libraries that log at INFO what no user of a command needs: importing Flower's state (any
# in-process federation does) imports alembic, which logs a line for each plugin it sets up.
CHATTY_LIBRARIES = ("alembic",)


def log_to_terminal(fmt: str = "%(message)s") -> None:
    """A command's logging: INFO records on stderr in ``fmt``, without the INFO chatter of
    :data:`CHATTY_LIBRARIES`."""
    logging.basicConfig(level=logging.INFO, format=fmt)
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)


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


def drop_misleading_notices(host: str = "flwr") -> None:
    """Filter :data:`MISLEADING_NOTICES` out of ``host``, the logger Flower logs them on
    (idempotent). Installed by the process that would print them: a filter reaches only the
    records of its own process."""
    logger = logging.getLogger(host)
    if not_misleading not in logger.filters:
        logger.addFilter(not_misleading)


def not_misleading(record: logging.LogRecord) -> bool:
    """False for a record of one of :data:`MISLEADING_NOTICES`."""
    return not (isinstance(record.msg, str) and record.msg in MISLEADING_NOTICES)
