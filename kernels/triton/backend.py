"""Paged attention with our Triton kernels: the GPU backend (runs on the CPU only under TRITON_INTERPRET=1).

forward() routes each request by its query length: one query -> the decode kernel (split-KV when the
contexts are long enough to leave SMs idle otherwise), several -> the prefill/extend kernel. Both
kernels read the whole step's packed query and write into one output, each touching only its own
requests' rows, so a mixed step needs no gather or scatter of Q or O.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.kernels.attention import CAUSAL, AttentionBackend, AttentionMetadata, AttentionRules
from pagedserve.kernels.triton.decode_attention import choose_num_splits, decode_attention
from pagedserve.kernels.triton.prefill_attention import prefill_attention
from pagedserve.kernels.triton.write_kv import write_kv


@dataclass(slots=True)
class _Routing:
    """Which kernel runs which requests in one step; req ids are None when a kernel takes them all."""

    decode_ids: torch.Tensor | None
    num_decode: int
    decode_max_seq_len: int
    num_splits: int
    prefill_ids: torch.Tensor | None
    num_prefill: int
    prefill_max_query_len: int


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def __init__(self) -> None:
        # forward() runs once per layer with the same step: route once per step, not per layer (the id
        # tensors are a host-to-device copy). Keyed on the lengths themselves (copied), not on the
        # metadata object, so a caller that reuses or mutates its metadata cannot get a stale route.
        self._routed_key: tuple[list[int], list[int], torch.device, int] | None = None
        self._routing: _Routing | None = None

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        write_kv(key, value, k_cache, v_cache, slot_mapping)

    def forward(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rules: AttentionRules = CAUSAL,
    ) -> torch.Tensor:
        out = torch.empty_like(query)
        route = self._route(meta, query.device, k_cache.shape[2])
        if route.num_decode:
            decode_attention(
                query,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                meta.query_start_loc,
                out,
                scale,
                max_seq_len=route.decode_max_seq_len,
                req_ids=route.decode_ids,
                num_splits=route.num_splits,
                rules=rules,
            )
        if route.num_prefill:
            prefill_attention(
                query,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                meta.query_start_loc,
                out,
                scale,
                max_query_len=route.prefill_max_query_len,
                req_ids=route.prefill_ids,
                rules=rules,
            )
        return out

    def _route(self, meta: AttentionMetadata, device: torch.device, num_kv_heads: int) -> _Routing:
        key = (meta.query_lens_cpu, meta.seq_lens_cpu, device, num_kv_heads)
        if self._routing is not None and self._routed_key == key:
            return self._routing
        decode = [b for b, q in enumerate(meta.query_lens_cpu) if q == 1]
        # q_len 0 (a request with nothing scheduled this step) goes to neither kernel.
        prefill = [b for b, q in enumerate(meta.query_lens_cpu) if q > 1]
        batch = meta.batch_size
        decode_max = max((meta.seq_lens_cpu[b] for b in decode), default=0)
        self._routing = _Routing(
            decode_ids=None if len(decode) == batch else _ids(decode, device),
            num_decode=len(decode),
            decode_max_seq_len=decode_max,
            num_splits=choose_num_splits(len(decode) * num_kv_heads, decode_max, device) if decode else 1,
            prefill_ids=None if len(prefill) == batch else _ids(prefill, device),
            num_prefill=len(prefill),
            prefill_max_query_len=max((meta.query_lens_cpu[b] for b in prefill), default=0),
        )
        self._routed_key = (list(meta.query_lens_cpu), list(meta.seq_lens_cpu), device, num_kv_heads)
        return self._routing


def _ids(reqs: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(reqs, dtype=torch.int32, device=device)
