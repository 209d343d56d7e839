"""decode_attention: one query per request over its paged context matches dense attention."""

from __future__ import annotations

import torch
import triton_env  # noqa: F401  (before any kernels import: selects the Triton interpreter)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triton_env import DEVICE, max_examples
from triton_kernels import run_decode

from pagedserve.kernels.paged_reference import TOLERANCES, make_paged_batch, reference_attention

SETTINGS = settings(
    max_examples=max_examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
# 80 and 96 are padded to 128 inside the kernel; weighted lower than the common sizes.
HEAD_DIMS = st.sampled_from([64, 128, 64, 128, 80, 96])


@SETTINGS
@given(
    seq_lens=st.lists(st.integers(1, 300), min_size=1, max_size=4),
    block_size=st.sampled_from([8, 16, 32, 64, 128]),
    group=st.sampled_from([1, 2, 4, 8]),
    num_kv_heads=st.sampled_from([1, 2]),
    head_dim=HEAD_DIMS,
    dtype=DTYPES,
    num_splits=st.sampled_from([1, 2, 3, None]),
    block_n=st.sampled_from([16, 64]),
    seed=st.integers(0, 2**16),
)
def test_decode_matches_dense_attention(
    seq_lens: list[int],
    block_size: int,
    group: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    num_splits: int | None,
    block_n: int,
    seed: int,
) -> None:
    batch = make_paged_batch(
        seq_lens,
        [1] * len(seq_lens),
        num_kv_heads * group,
        num_kv_heads,
        head_dim,
        block_size,
        dtype,
        DEVICE,
        seed,
    )
    scale = head_dim**-0.5

    out = run_decode(batch, scale, num_splits=num_splits, block_n=block_n)

    atol, rtol = TOLERANCES[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.float().cpu(), reference_attention(batch, scale), atol=atol, rtol=rtol)


def test_split_kv_with_partitions_past_a_short_context_matches_one_pass() -> None:
    # Partitions are sized from the longest context: a short request's later partitions are empty
    # and must drop out of the merge rather than poison it with nan.
    batch = make_paged_batch([260, 3, 70], [1, 1, 1], 4, 2, 64, 16, torch.float32, DEVICE, seed=7)

    split = run_decode(batch, 0.125, num_splits=5, block_n=16)
    single = run_decode(batch, 0.125, num_splits=1)

    torch.testing.assert_close(split, single, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(split.cpu(), reference_attention(batch, 0.125), atol=2e-5, rtol=2e-5)


def test_selected_requests_only_are_written() -> None:
    # The backend passes the whole packed step and the ids of its decode requests.
    batch = make_paged_batch([40, 9, 100], [1, 1, 1], 2, 1, 64, 8, torch.float32, DEVICE, seed=3)
    req_ids = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)

    out = run_decode(batch, 0.125, req_ids=req_ids, num_splits=2, block_n=16)

    ref = reference_attention(batch, 0.125)
    torch.testing.assert_close(out[[0, 2]].cpu(), ref[[0, 2]], atol=2e-5, rtol=2e-5)
    assert out[1].isnan().all()
