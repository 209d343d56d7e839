"""The Triton kernels on a real GPU: `python -m pagedserve.ops.gpu.check`, run by ops/gpu_check.sh."""
