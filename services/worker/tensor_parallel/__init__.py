"""Tensor-parallel worker groups: one model split over N processes (docs/tensor-parallel.md).

shard.py (which slice of each weight a rank keeps), orders.py (a step's inputs on the wire), group.py
(rank 0's side: it starts, feeds and watches the others), follower.py (a rank > 0).
"""


class GroupRefused(ValueError):
    """A model this group cannot split (a dimension that does not divide by its size): a configuration
    to change, not a process to restart. Here, without torch, so the worker's exit path can name it."""
