"""Attention and KV-cache kernels behind one interface: `cpp` (our C++ CPU kernel, kernels/cpu/: the
default on the CPU), `torch` (the reference, and the CPU's fallback where the C++ cannot build) and
`triton` (GPU)."""
