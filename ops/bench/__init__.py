"""`pagedserve bench`: the workload, each peer's path, the services run and the report."""

from pagedserve.ops.bench.command import main

__all__ = ["main"]
