"""The worker's KV pool: per layer, K and V tensors [num_blocks, block_size, num_kv_heads, head_dim].

Block ids from the block manager index dimension 0 directly. The pool is sized once, at start-up,
from an explicit block count or a byte budget, and reported to the block manager.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class KVCacheShape:
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block, over every layer."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element


def num_blocks_for_budget(shape: KVCacheShape, budget_bytes: int) -> int:
    num_blocks = budget_bytes // shape.bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"a KV budget of {budget_bytes} bytes holds no block: one block of {shape.block_size} tokens "
            f"needs {shape.bytes_per_block} bytes"
        )
    return num_blocks


def cuda_budget(device: torch.device, gpu_memory_utilization: float) -> int:
    """A fraction of the memory free now (after the weights are loaded); the rest is for activations."""
    free, _total = torch.cuda.mem_get_info(device)
    return int(free * gpu_memory_utilization)


class KVCache:
    def __init__(self, shape: KVCacheShape, num_blocks: int, device: torch.device | str) -> None:
        self.shape = shape
        self.num_blocks = num_blocks
        dims = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
        # Zeroed, not empty: padded decode attention reads (masked) slots never written, and
        # garbage there could be NaN, which a zero attention weight does not cancel.
        self.k = [torch.zeros(dims, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]
        self.v = [torch.zeros(dims, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]

    @property
    def block_size(self) -> int:
        return self.shape.block_size

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(zip(self.k, self.v, strict=True))

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: block src's K and V become block dst's, in every layer."""
        if not pairs:
            return
        device = self.k[0].device
        src = torch.tensor([p[0] for p in pairs], dtype=torch.int64, device=device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64, device=device)
        for cache in (*self.k, *self.v):
            cache[dst] = cache[src]
