"""Attention and KV-cache kernels behind one interface: `torch` (reference, CPU) and `triton` (GPU)."""
