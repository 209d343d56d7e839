"""The worker's KV pool: per layer, K and V tensors [num_blocks, block_size, num_kv_heads, head_dim].

Block ids from the block manager index dimension 0 directly. The pool is sized once, at start-up
(kv_budget.py), and reported to the block manager.

On the CPU every tensor is a view into one flat mapping: anonymous memory by default, or a
shared-memory segment that outlives the worker (kv_segment.py). Either way the pages are zero until
first written and are only taken from the machine when touched, so a pool sized for the machine
costs nothing at start and a restarted worker finds its KV where it left it.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pagedserve.kernels.kv_int8 import row_dim
from pagedserve.services.worker.kv_budget import blocks_in

_ALIGN = 4096  # each tensor starts on a page: SIMD loads aligned, and a header page fits in front


@dataclass(frozen=True, slots=True)
class KVCacheShape:
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def row_dim(self) -> int:
        """The cache's last dimension: head_dim, and for int8 KV its scale's 4 bytes (kernels/kv_int8.py)."""
        return row_dim(self.head_dim) if self.dtype == torch.int8 else self.head_dim

    @property
    def dims(self) -> tuple[int, int, int]:
        return self.block_size, self.num_kv_heads, self.row_dim

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block, over every layer."""
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.row_dim * self.element_size

    def tensor_bytes(self, num_blocks: int) -> int:
        """One layer's K (or V) tensor."""
        return num_blocks * self.block_size * self.num_kv_heads * self.row_dim * self.element_size

    def pool_bytes(self, num_blocks: int) -> int:
        """Every tensor of the pool laid out in one mapping, each on its own page."""
        return 2 * self.num_layers * _aligned(self.tensor_bytes(num_blocks))


def resolve_kv_dtype(
    kv_cache_dtype: str, model_dtype: torch.dtype, device: torch.device, backend: str
) -> torch.dtype:
    """What K/V is stored as; ValueError naming the setting where this worker cannot do it."""
    if kv_cache_dtype == "auto":
        return model_dtype
    wanted = getattr(torch, kv_cache_dtype)
    if wanted == model_dtype:
        return wanted
    # Narrower than the model: int8 under any model, bfloat16 under a float32 one, both CPU kernels'.
    what = (
        "int8"
        if wanted == torch.int8
        else f"{kv_cache_dtype} with a {str(model_dtype).removeprefix('torch.')} model"
    )
    if wanted != torch.int8 and (wanted, model_dtype) != (torch.bfloat16, torch.float32):
        raise ValueError(
            f"kv_cache_dtype {what} is not supported: K/V is kept in the model's dtype, in int8, or (a "
            "float32 model) in bfloat16; use auto, int8 or bfloat16"
        )
    if device.type != "cpu" or backend == "triton":
        raise ValueError(
            f"kv_cache_dtype {what} runs on the CPU (the C++ kernel, or the torch reference); "
            f"this worker runs {backend} on {device.type}: use kv_cache_dtype auto there"
        )
    return wanted


def num_blocks_for_budget(shape: KVCacheShape, budget_bytes: int) -> int:
    return blocks_in(budget_bytes, shape.bytes_per_block, shape.block_size)


def cuda_budget(device: torch.device, gpu_memory_utilization: float) -> int:
    """A fraction of the memory free now (after the weights are loaded); the rest is for activations."""
    free, _total = torch.cuda.mem_get_info(device)
    return int(free * gpu_memory_utilization)


def anonymous_memory(nbytes: int) -> mmap.mmap:
    """Private zero pages, taken from the machine only when written (torch.zeros would touch them all)."""
    return mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class KVCache:
    def __init__(
        self,
        shape: KVCacheShape,
        num_blocks: int,
        device: torch.device | str,
        memory: mmap.mmap | None = None,
        offset: int = 0,
    ) -> None:
        """`memory` (CPU only): the mapping to lay the pool out in, from `offset` on; default a fresh
        anonymous one. The caller keeps it open for the cache's life."""
        self.shape = shape
        self.num_blocks = num_blocks
        dims = (num_blocks, *shape.dims)
        if torch.device(device).type != "cpu":
            # Zeroed, not empty: padded decode attention reads (masked) slots never written, and
            # garbage there could be NaN, which a zero attention weight does not cancel.
            self.k = [torch.zeros(dims, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]
            self.v = [torch.zeros(dims, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]
            self.memory = None
            return
        self.memory = memory if memory is not None else anonymous_memory(shape.pool_bytes(num_blocks))
        if len(self.memory) < offset + shape.pool_bytes(num_blocks):
            raise ValueError(
                f"a KV mapping of {len(self.memory)} bytes cannot hold {num_blocks} blocks from offset "
                f"{offset} ({shape.pool_bytes(num_blocks)} bytes)"
            )
        flat = torch.frombuffer(self.memory, dtype=torch.uint8)
        step = _aligned(shape.tensor_bytes(num_blocks))
        views = [
            flat[offset + i * step : offset + i * step + shape.tensor_bytes(num_blocks)]
            .view(shape.dtype)
            .view(dims)
            for i in range(2 * shape.num_layers)
        ]
        self.k, self.v = views[0::2], views[1::2]

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


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN
