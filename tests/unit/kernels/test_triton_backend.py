"""TritonAttentionBackend: write_kv then forward over mixed steps matches dense attention and the torch backend."""

from __future__ import annotations

import pytest
import torch
import triton_env  # noqa: F401  (before any kernels import: selects the Triton interpreter)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triton_env import DEVICE, max_examples

from pagedserve.kernels.attention import get_backend
from pagedserve.kernels.paged_reference import TOLERANCES, PagedBatch, make_paged_batch, reference_attention
from pagedserve.kernels.triton.backend import TritonAttentionBackend


def _step(backend, batch: PagedBatch, scale: float) -> torch.Tensor:
    """Erase this step's slots, then write them back through the backend and attend, as a layer does."""
    num_kv_heads, head_dim = batch.k_cache.shape[2:]
    batch.k_cache.view(-1, num_kv_heads, head_dim)[batch.slot_mapping] = 0
    batch.v_cache.view(-1, num_kv_heads, head_dim)[batch.slot_mapping] = 0
    backend.write_kv(batch.key, batch.value, batch.k_cache, batch.v_cache, batch.slot_mapping)
    return backend.forward(batch.query, batch.k_cache, batch.v_cache, batch.metadata(), scale)


@st.composite
def requests(draw: st.DrawFn) -> tuple[int, int]:
    """(seq_len, q_len): mostly decodes, some prefills and chunks, now and then nothing scheduled."""
    seq_len = draw(st.integers(1, 300))
    q_len = draw(st.one_of(st.just(1), st.just(1), st.integers(0, min(seq_len, 40))))
    return seq_len, q_len


@settings(max_examples=max_examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(requests(), min_size=1, max_size=4),
    block_size=st.sampled_from([8, 16, 32, 64, 128]),
    group=st.sampled_from([1, 2, 4, 8]),
    head_dim=st.sampled_from([64, 128]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_mixed_step_matches_dense_attention(
    reqs: list[tuple[int, int]], block_size: int, group: int, head_dim: int, dtype: torch.dtype, seed: int
) -> None:
    seq_lens = [s for s, _ in reqs]
    query_lens = [q for _, q in reqs]
    if sum(query_lens) == 0:
        query_lens[0] = 1
    batch = make_paged_batch(seq_lens, query_lens, 2 * group, 2, head_dim, block_size, dtype, DEVICE, seed)
    scale = head_dim**-0.5

    out = _step(TritonAttentionBackend(), batch, scale)

    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.float().cpu(), reference_attention(batch, scale), atol=atol, rtol=rtol)


def test_one_backend_serves_successive_steps_and_layers() -> None:
    # The routing is cached per step: a new step with other lengths must not reuse the old one.
    backend = TritonAttentionBackend()
    for seq_lens, query_lens in (([20, 5], [1, 5]), ([21, 6], [1, 1]), ([21, 6, 9], [0, 1, 9])):
        batch = make_paged_batch(
            seq_lens, query_lens, 4, 2, 64, 16, torch.float32, DEVICE, seed=len(seq_lens)
        )
        for _layer in range(2):
            out = _step(backend, batch, 0.125)
            torch.testing.assert_close(out.cpu(), reference_attention(batch, 0.125), atol=2e-5, rtol=2e-5)


def test_get_backend_returns_the_triton_backend() -> None:
    assert isinstance(get_backend("triton", DEVICE), TritonAttentionBackend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_agrees_with_the_torch_backend(dtype: torch.dtype) -> None:
    from pagedserve.kernels.torch_backend import TorchAttentionBackend

    seq_lens, query_lens = [1, 77, 200, 150, 33], [1, 1, 1, 40, 33]
    batch = make_paged_batch(seq_lens, query_lens, 8, 2, 64, 16, dtype, DEVICE, seed=21)

    triton_out = _step(TritonAttentionBackend(), batch, 0.125)
    torch_out = _step(TorchAttentionBackend(), batch, 0.125)

    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(triton_out.float().cpu(), torch_out.float().cpu(), atol=atol, rtol=rtol)
