"""What a CUDA machine gives the project: tokens/s, MFU, the paper regime shrunk (CPU: smoke)."""
