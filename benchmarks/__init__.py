"""Benchmark scripts; importable so the tests can drive them."""
