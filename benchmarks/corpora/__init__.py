"""Corpus sets built from what package registries ship (``python -m benchmarks.corpora``)."""
