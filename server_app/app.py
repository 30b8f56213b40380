"""Flower entry point of the server side; the work is in :mod:`server_app.federation`.

An error ends the ServerApp as a :class:`~server_app.run_status.RunFailed` carrying its one
line, so Flower marks the run failed (``flwr ls`` shows it) while the log stream shows that
line rather than a traceback (``DEPT_DEBUG=1`` keeps the traceback).
"""

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from dept.logs import route_to
from server_app.run_status import RunFailed, TracebackFilter, debugging, one_line

log = logging.getLogger(__name__)
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    route_to("flwr")
    logging.getLogger("flwr").addFilter(TracebackFilter())
    try:
        # Imported here, not with this module: Flower's simulation imports the ServerApp,
        # then loads the ClientApp and starts Ray in the same process, and the federation's
        # imports (torch, Transformers: seconds of CPU) held both back; Ray starts beside them.
        from server_app.federation import run_federation

        run_federation(grid, context.run_config)
    except Exception as exc:
        notes = "; ".join(getattr(exc, "__notes__", []))
        log.error("run failed: %s%s", one_line(exc), f" ({notes})" if notes else "")
        if debugging():
            raise
        raise RunFailed(one_line(exc)) from None
