"""What the machinery costs: time and memory per message, per round, per node and server."""
