"""Operating pagedserve, one package per job: `cli` (the `pagedserve` command), `deploy` (the local
supervised deployment), `bench` and `chaos` (their commands), `microbench` (core micro-benchmarks),
`gpu` (the Triton kernels checked on a real GPU), `models` (model files made for benchmarks).
Nothing under services/, shared/ or kernels/ imports ops.
"""
