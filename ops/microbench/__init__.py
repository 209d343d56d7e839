"""Micro-benchmarks of the cores, one module each: `python -m pagedserve.ops.microbench.<block_manager |
scheduler | runner | sampler>`. Each writes its JSON under bench/results/."""
