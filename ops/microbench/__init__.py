"""Micro-benchmarks of the cores, one module each: `python -m pagedserve.ops.microbench.<block_manager |
scheduler | runner | sampler | step_profile>` (step_profile: where one worker step's time goes;
tp_memory, tp_orders: a tensor-parallel rank's memory, and how its step inputs are cheapest sent)."""
