"""Server-side DEPT: the Flower strategy, outer optimizers, update validation, accounting."""
