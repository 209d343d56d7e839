"""The C++ CPU kernel (CppAttentionBackend) against the written-out float32 reference on random paged
steps. Not against the torch backend: with a softcap it rounds scores to the cache dtype as Hugging
Face's eager attention does, which in bfloat16 alone drifts up to ~0.03 from the exact result.

Every ISA path (kernels/cpu/isa.py: avx512, avx2, portable) this CPU can execute, each its own build;
a path the CPU cannot run is skipped, naming the CPU flags it lacks, and a path that does not build
fails. Shapes, block sizes 8-128, GQA ratios, mixed decode / prefill / continued-chunk rows, float32
and bfloat16 caches (and float32 queries over bfloat16 caches, a float32 model's narrowed K/V); head
dims that take the fast path on every path (multiples of 16 up to 128), ones that take it on the
8-lane paths only (40, 72) and ones no path's fast path takes (36, 160), and the generic algorithm
called on its own. Unused cache slots hold large garbage, so a read past a
row's context shows. Half the steps run under a layer's rules too: a sliding window (odd sizes, some
shorter than a block, some longer than the context) and a logit softcap.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedserve.kernels.attention import CAUSAL, AttentionRules, get_backend
from pagedserve.kernels.cpu.backend import CppAttentionBackend
from pagedserve.kernels.cpu.build import PAGED_ATTENTION, load_extension
from pagedserve.kernels.cpu.isa import ISA_ENV, runnable_isas
from pagedserve.kernels.paged_reference import PagedBatch, make_paged_batch, reference_attention
from pagedserve.kernels.torch_backend import TorchAttentionBackend

# bf16: both sides end rounded to bf16, the kernel after summing in its own order and blocking.
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2)}


@st.composite
def steps(draw: st.DrawFn) -> dict:
    num_kv_heads = draw(st.sampled_from([1, 2, 3]))
    group = draw(st.sampled_from([1, 2, 3, 4]))
    rows = draw(st.integers(1, 6))
    seq_lens, query_lens = [], []
    for _ in range(rows):
        seq_len = draw(st.integers(1, 300))
        kind = draw(st.sampled_from(["decode", "prefill", "chunk"]))
        q_len = {"decode": 1, "prefill": seq_len, "chunk": draw(st.integers(1, seq_len))}[kind]
        seq_lens.append(seq_len)
        query_lens.append(q_len)
    return {
        "seq_lens": seq_lens,
        "query_lens": query_lens,
        "num_heads": num_kv_heads * group,
        "num_kv_heads": num_kv_heads,
        "head_dim": draw(st.sampled_from([16, 32, 36, 40, 64, 72, 80, 128, 160])),
        "block_size": draw(st.sampled_from([8, 16, 32, 64, 128])),
        "dtype": draw(st.sampled_from([torch.float32, torch.bfloat16])),
        "seed": draw(st.integers(0, 2**16)),
    }


def narrowed(batch: PagedBatch) -> PagedBatch:
    """The step with its caches rounded to bfloat16 under float32 queries (kv_cache_dtype bfloat16 of a
    float32 model): the reference reads the rounded K/V in float32, so the float32 tolerance holds."""
    return dataclasses.replace(batch, k_cache=batch.k_cache.bfloat16(), v_cache=batch.v_cache.bfloat16())


@st.composite
def rules(draw: st.DrawFn) -> AttentionRules:
    if draw(st.booleans()):
        return CAUSAL
    window = draw(st.sampled_from([None, 1, 3, 7, 13, 31, 100, 1000]))
    softcap = draw(st.sampled_from([None, 0.5, 5.0, 50.0]))
    return AttentionRules(window, softcap)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=steps(), rule=rules(), narrow=st.booleans())
def test_cpp_matches_the_torch_backend(isa: str, case: dict, rule: AttentionRules, narrow: bool) -> None:
    batch = make_paged_batch(**case, device=torch.device("cpu"))
    if narrow and case["dtype"] == torch.float32:
        batch = narrowed(batch)
    meta = batch.metadata()
    scale = case["head_dim"] ** -0.5
    expected = reference_attention(batch, scale, rule).to(case["dtype"])
    backend = CppAttentionBackend(isa)
    assert backend.isa == isa
    got = backend.forward(batch.query, batch.k_cache, batch.v_cache, meta, scale, rule)
    atol, rtol = TOLERANCE[case["dtype"]]
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=rtol)
    # q as the model passes it: a view into the fused q/k/v rows (here with NaN heads beside it,
    # which any read outside q's own heads would spread into the output).
    fused = torch.full((batch.query.shape[0], case["num_heads"] + 2, case["head_dim"]), float("nan"))
    fused = fused.to(case["dtype"])
    fused[:, : case["num_heads"]] = batch.query
    strided = backend.forward(fused[:, : case["num_heads"]], batch.k_cache, batch.v_cache, meta, scale, rule)
    assert torch.equal(strided, got)
    # The generic algorithm of this path on the same step, whichever algorithm `got` took.
    generic = torch.empty_like(batch.query)
    load_extension(PAGED_ATTENTION, isa).paged_attention_generic(
        fused[:, : case["num_heads"]],
        batch.k_cache,
        batch.v_cache,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables,
        scale,
        rule.window or 0,
        rule.softcap or 0.0,
        generic,
    )
    torch.testing.assert_close(generic.float(), expected.float(), atol=atol, rtol=rtol)


def test_auto_is_the_cpp_kernel_on_the_cpu() -> None:
    assert get_backend("auto", "cpu").name == "cpp"


def test_the_backend_runs_the_best_runnable_path_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ISA_ENV, raising=False)
    assert CppAttentionBackend().isa == runnable_isas()[0]


def test_the_isa_environment_variable_picks_the_path(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ISA_ENV, isa)
    backend = CppAttentionBackend()
    assert backend.isa == isa
    # and it runs that path's op: the same bits as the path loaded by name
    batch = make_paged_batch([70, 5], [1, 5], 6, 2, 64, 16, torch.float32, torch.device("cpu"), seed=3)
    meta = batch.metadata()
    got = backend.forward(batch.query, batch.k_cache, batch.v_cache, meta, 0.125)
    by_name = torch.empty_like(batch.query)
    load_extension(PAGED_ATTENTION, isa).paged_attention(
        batch.query,
        batch.k_cache,
        batch.v_cache,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables,
        0.125,
        0,
        0.0,
        by_name,
    )
    assert torch.equal(got, by_name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "rules"), [(9, 3, CAUSAL), (16, 4, AttentionRules(37, 30.0))]
)
def test_one_request_split_over_threads_by_kv_head_gives_the_same_bits(
    isa: str, dtype: torch.dtype, num_heads: int, num_kv_heads: int, rules: AttentionRules
) -> None:
    """Fewer items than threads (one request's decode, or its short prefill): the kernel hands out its
    KV heads apart. Each row's sums run in the same order either way, so 2 threads (split) give the
    bits 1 thread (whole) gives, and both match the reference."""
    threads = torch.get_num_threads()
    backend = CppAttentionBackend(isa)
    try:
        for seq_len, q_len in ((211, 1), (40, 9)):
            batch = make_paged_batch(
                [seq_len], [q_len], num_heads, num_kv_heads, 64, 16, dtype, torch.device("cpu"), 5
            )
            meta = batch.metadata()
            torch.set_num_threads(1)
            whole = backend.forward(batch.query, batch.k_cache, batch.v_cache, meta, 0.125, rules)
            torch.set_num_threads(2)
            split = backend.forward(batch.query, batch.k_cache, batch.v_cache, meta, 0.125, rules)
            assert torch.equal(split, whole), (seq_len, q_len)
            expected = reference_attention(batch, 0.125, rules).to(dtype)
            torch.testing.assert_close(
                split.float(), expected.float(), atol=TOLERANCE[dtype][0], rtol=TOLERANCE[dtype][1]
            )
    finally:
        torch.set_num_threads(threads)


def test_a_context_longer_than_its_block_table_is_refused(isa: str) -> None:
    batch = make_paged_batch([40], [1], 4, 2, 16, 16, torch.float32, torch.device("cpu"), seed=0)
    meta = batch.metadata()
    meta.seq_lens = torch.tensor([60], dtype=torch.int32)  # 4 blocks; the table has 3
    with pytest.raises(RuntimeError, match="more blocks than block_tables has columns"):
        CppAttentionBackend(isa).forward(batch.query, batch.k_cache, batch.v_cache, meta, 0.25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tokens=st.integers(1, 40),
    num_kv_heads=st.sampled_from([1, 3]),
    head_dim=st.sampled_from([16, 64, 80]),
    block_size=st.sampled_from([8, 16]),
    dtypes=st.sampled_from([(torch.float32,) * 2, (torch.bfloat16,) * 2, (torch.float32, torch.bfloat16)]),
    seed=st.integers(0, 2**16),
)
def test_cpp_write_kv_matches_the_torch_backend(
    isa, tokens, num_kv_heads, head_dim, block_size, dtypes, seed
):
    dtype, cache_dtype = dtypes  # float32 rows into bfloat16 caches are rounded to nearest even on both sides
    gen = torch.Generator().manual_seed(seed)
    # K and V as the model hands them over: views into one fused q/k/v row per token.
    kv = num_kv_heads * head_dim
    qkv = torch.randn(tokens, 2 * kv + 2 * kv, generator=gen).to(dtype)
    key = qkv[:, 2 * kv : 3 * kv].view(tokens, num_kv_heads, head_dim)
    value = qkv[:, 3 * kv :].view(tokens, num_kv_heads, head_dim)
    shape = (-(-tokens // block_size) + 2, block_size, num_kv_heads, head_dim)
    slots = torch.randperm(shape[0] * block_size, generator=gen)[:tokens]
    caches = {
        name: (torch.full(shape, 7.0).to(cache_dtype), torch.full(shape, -7.0).to(cache_dtype))
        for name in ("torch", "cpp")
    }
    TorchAttentionBackend().write_kv(key, value, *caches["torch"], slots)
    CppAttentionBackend(isa).write_kv(key, value, *caches["cpp"], slots)
    assert torch.equal(caches["cpp"][0], caches["torch"][0])
    assert torch.equal(caches["cpp"][1], caches["torch"][1])


def test_cpp_write_kv_refuses_a_slot_outside_the_cache(isa: str) -> None:
    key = torch.randn(2, 1, 16)
    k_cache, v_cache = torch.zeros(2, 8, 1, 16), torch.zeros(2, 8, 1, 16)
    with pytest.raises(RuntimeError, match="token 1 has slot 16, outside the cache's 16"):
        CppAttentionBackend(isa).write_kv(key, key, k_cache, v_cache, torch.tensor([3, 16]))
    assert not k_cache.any() and not v_cache.any()  # nothing written, not even the valid token 0
