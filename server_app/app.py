"""Flower entry point of the server side; the work is in :mod:`server_app.federation`."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from dept.logs import route_to
from server_app.federation import run_federation

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    route_to("flwr")
    run_federation(grid, context.run_config)
