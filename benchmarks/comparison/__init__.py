"""What a method or setting reaches, and what it costs in bytes: the same data and budget."""
