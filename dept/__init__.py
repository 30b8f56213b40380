"""DEPT core: config, model split, sources, tokenizers, training, evaluation (no Flower)."""
