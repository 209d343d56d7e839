"""The `pagedserve` command (`pagedserve.ops.cli:main`) and the small client-side subcommands it runs."""

from pagedserve.ops.cli.command import main

__all__ = ["main"]
