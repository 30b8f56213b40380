"""One comparison run's log: every line labelled with the run, and all of it in the run's file.

``dept compare`` runs several methods at once in worker processes that share the terminal,
so each line starts with its run's label (``[spec-opt lr 0.004] ...``). The label is put on
the record where it is made (the log-record factory), so it reaches every handler: Flower's
console handler, which the apps route the project's loggers to (:func:`dept.logs.route_to`),
and the run's own ``run.log``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dept.logs import PROJECT_LOGGERS, route_to

FILE_FORMAT = "%(asctime)s %(name)s %(message)s"


@contextmanager
def run_logging(label: str, path: Path) -> Iterator[None]:
    """While it is open, every record this process makes is prefixed with ``[label]`` and
    written to ``path`` as well as wherever it went before; afterwards both are undone."""
    importlib.import_module("flwr.common.logger")  # adds Flower's console handler

    make_record = logging.getLogRecordFactory()

    def labelled(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        # Formatted now, so every line of a message of several (a table, a traceback) is labelled.
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        lines = text.splitlines() or [""]
        record.msg, record.args = "\n".join(f"[{label}] {line}" for line in lines), ()
        return record

    file = logging.FileHandler(path)
    file.setFormatter(logging.Formatter(FILE_FORMAT))
    root, flwr = logging.getLogger(), logging.getLogger("flwr")
    level = root.level
    root.setLevel(min(level, logging.INFO))  # a worker process's root starts at WARNING
    # Flower's records stop at its own handlers (else root's file handler writes them twice);
    # route_to gives the project's loggers those handlers, this file included.
    propagates, flwr.propagate = flwr.propagate, False
    for logger in (root, flwr):
        logger.addHandler(file)
    route_to("flwr")
    logging.setLogRecordFactory(labelled)
    try:
        yield
    finally:
        logging.setLogRecordFactory(make_record)
        for name in ("", "flwr", *PROJECT_LOGGERS):
            logging.getLogger(name).removeHandler(file)
        flwr.propagate = propagates
        root.setLevel(level)
        file.close()
