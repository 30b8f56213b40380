"""Benchmark scripts, run from the checkout's root as ``python -m benchmarks.<group>.<name>``;
importable so the tests can drive them. A folder per question, each with a README of what it
measures and its latest result: :mod:`benchmarks.comparison` (what a method or setting
reaches, and at what cost in bytes), :mod:`benchmarks.overhead` (what the machinery costs:
time, memory, per message, per round), :mod:`benchmarks.soak` (what a deployment survives)
and :mod:`benchmarks.gpu` (what a CUDA machine gives). Shared by all: :mod:`benchmarks.measure`
(interleaved repeats, tables, output files) and :mod:`benchmarks.timed_grid` (an in-process
grid that times each message). Results are committed under ``benchmarks/results/``."""
