"""What a deployment survives: a loopback federation trained through injected faults."""
