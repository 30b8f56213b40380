"""The Flower ServerApp: reads the run config, runs the DEPT rounds, writes the run report."""
