"""prefill_attention: packed variable-length queries over paged context match causal dense attention."""

from __future__ import annotations

import torch
import triton_env  # noqa: F401  (before any kernels import: selects the Triton interpreter)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triton_env import DEVICE, max_examples
from triton_kernels import run_prefill

from pagedserve.kernels.paged_reference import TOLERANCES, make_paged_batch, reference_attention

SETTINGS = settings(
    max_examples=max_examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def chunks(draw: st.DrawFn) -> tuple[int, int]:
    """(seq_len, q_len): a whole prompt, a later chunk, or a prefix-cache hit extended by a few tokens."""
    seq_len = draw(st.integers(1, 300))
    q_len = draw(st.one_of(st.just(seq_len), st.integers(1, seq_len)))
    return seq_len, q_len


@SETTINGS
@given(
    requests=st.lists(chunks(), min_size=1, max_size=3),
    block_size=st.sampled_from([8, 16, 32, 64, 128]),
    group=st.sampled_from([1, 2, 4, 8]),
    head_dim=st.sampled_from([64, 128, 64, 128, 80, 96]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    block_m=st.sampled_from([16, 64, None]),
    seed=st.integers(0, 2**16),
)
def test_prefill_matches_causal_dense_attention(
    requests: list[tuple[int, int]],
    block_size: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype,
    block_m: int | None,
    seed: int,
) -> None:
    seq_lens = [s for s, _ in requests]
    query_lens = [q for _, q in requests]
    # One KV head keeps the interpreter quick: the kernel indexes KV heads like query heads.
    batch = make_paged_batch(seq_lens, query_lens, group, 1, head_dim, block_size, dtype, DEVICE, seed)
    scale = head_dim**-0.5

    out = run_prefill(batch, scale, block_m=block_m, block_n=32)

    atol, rtol = TOLERANCES[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.float().cpu(), reference_attention(batch, scale), atol=atol, rtol=rtol)


def test_chunk_after_cached_prefix_attends_to_the_prefix() -> None:
    # A prefix-cache hit: 37 tokens already in the cache, 12 new ones; and a second KV head, so the
    # query-head -> KV-head mapping is exercised with GQA.
    batch = make_paged_batch([49, 20], [12, 20], 8, 2, 64, 16, torch.float32, DEVICE, seed=11)

    out = run_prefill(batch, 0.125)

    torch.testing.assert_close(out.cpu(), reference_attention(batch, 0.125), atol=2e-5, rtol=2e-5)


def test_selected_requests_only_are_written() -> None:
    batch = make_paged_batch([30, 1, 50], [30, 1, 20], 2, 1, 64, 16, torch.float32, DEVICE, seed=5)
    req_ids = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)

    out = run_prefill(batch, 0.125, req_ids=req_ids)

    ref = reference_attention(batch, 0.125)
    torch.testing.assert_close(out[:30].cpu(), ref[:30], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(out[31:].cpu(), ref[31:], atol=2e-5, rtol=2e-5)
    assert out[30].isnan().all()
