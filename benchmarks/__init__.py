"""Benchmark scripts, run from the checkout's root as ``python -m benchmarks.<name>``;
importable so the tests can drive them."""
