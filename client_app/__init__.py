"""The Flower ClientApp: one node = one data source, with its own tokenizer and embeddings."""
