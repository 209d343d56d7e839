"""Triton kernels for paged attention: KV writes, decode (with split-KV) and prefill/extend.

Each module imports only torch and triton, so the GPU check can run them on an image without the
service dependencies. Set TRITON_INTERPRET=1 before importing triton to run them on the CPU.
"""
