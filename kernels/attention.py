"""The attention backend interface every model layer calls, and the metadata of one packed step.

Layouts (all backends):
- query  [num_tokens, num_heads, head_dim]; key / value [num_tokens, num_kv_heads, head_dim]
  (all scheduled tokens of all requests, packed, no padding);
- k_cache / v_cache per layer [num_blocks, block_size, num_kv_heads, head_dim];
- token t's K/V lives at slot `slot_mapping[t] = block_id * block_size + offset`.

Request b's queries are query[query_start_loc[b]:query_start_loc[b+1]]; its context after this
step has seq_lens[b] tokens, so its i-th query sits at position seq_lens[b] - query_len_b + i and
attends (causally) to context positions <= that, read through block_tables[b].

Two per-layer rules every backend applies exactly (`AttentionRules`): a sliding `window` (a query at
position p sees only positions p - window + 1 .. p, Hugging Face's `kv > q - window`) and a logit
`softcap` (each scaled score s becomes softcap * tanh(s / softcap) before the softmax).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class AttentionRules:
    """What one layer's attention applies besides causality; the defaults are plain causal attention."""

    window: int | None = None  # keep only the `window` latest positions of each query (itself included)
    softcap: float | None = None  # scores s -> softcap * tanh(s / softcap), before the softmax

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"sliding window must be >= 1 position, got {self.window}")
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"attention softcap must be > 0, got {self.softcap}")

    def first_visible(self, position: int) -> int:
        """The first context position a query at `position` sees."""
        return 0 if self.window is None else max(0, position + 1 - self.window)


CAUSAL = AttentionRules()


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64
    query_start_loc: torch.Tensor  # [batch + 1] int32, cumulative query lengths
    seq_lens: torch.Tensor  # [batch] int32, context length including this step's tokens
    block_tables: torch.Tensor  # [batch, max_blocks_per_seq] int32, padded with 0
    max_query_len: int
    max_seq_len: int
    # Host copies, so CPU code can loop or bucket without a device sync.
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)


class AttentionBackend(ABC):
    """One implementation of paged attention. Stateless: caches and metadata are arguments."""

    name: str

    @abstractmethod
    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store this step's K/V into the paged cache at their slots."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rules: AttentionRules = CAUSAL,
    ) -> torch.Tensor:
        """Causal attention of every packed query over its request's paged context, under `rules` (a
        sliding window, a logit softcap) -> [num_tokens, H, D]."""


def get_backend(name: str, device: torch.device | str) -> AttentionBackend:
    """`auto` picks triton on CUDA, and on the CPU our C++ kernel (torch if it cannot be built here)."""
    device = torch.device(device)
    if name == "auto":
        if device.type == "cuda":
            name = "triton"
        else:
            from pagedserve.kernels.cpu.build import KernelBuildError

            try:
                return get_backend("cpp", device)
            except KernelBuildError:
                name = "torch"  # still correct, only slower; the loader logged why, on one line
    if name == "torch":
        from pagedserve.kernels.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "cpp":
        from pagedserve.kernels.cpu.backend import CppAttentionBackend

        return CppAttentionBackend()
    if name == "triton":
        from pagedserve.kernels.triton.backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"attention_backend must be one of auto, torch, cpp, triton; got {name!r}")
