"""`pagedserve chaos`: kill workers under load, then check that every request finished and no block leaked."""

from pagedserve.ops.chaos.command import main

__all__ = ["main"]
