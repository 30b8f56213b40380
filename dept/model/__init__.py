"""What is trained: the model families and their sizes, built from configs with the body and
embeddings found through the HF API (:mod:`.families`); the variants, what each shares
(:mod:`.variants`); and the outer optimizers (:mod:`.outer_optimizers`). The three tables the
config's choices come from. May import :mod:`dept.paths` only."""
