"""int8 KV: the quantizing write and the attention that reads int8 in place, on every ISA path.

The C++ write must give the torch quantizer's bytes exactly; the C++ attention (its vector item and
its scalar item, `paged_attention_int8_generic`) must match the float32 reference
(kernels/paged_reference.py) run on the dequantized K/V, on random paged steps: decode, prefill and
continued chunks, GQA, block sizes 8-128, head dims the vector item takes and one it does not,
float32 and bfloat16 queries, plain causal or under a layer's rules (a sliding window, a softcap).
Slots no table names hold garbage rows (large values, huge scales), so a read past a row's context
shows.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedserve.kernels.attention import CAUSAL, AttentionRules
from pagedserve.kernels.cpu.backend import CppAttentionBackend
from pagedserve.kernels.cpu.build import KV_INT8, load_extension
from pagedserve.kernels.kv_int8 import Int8KVBackend, dequantize_rows, quantize_rows, row_dim
from pagedserve.kernels.paged_reference import PagedBatch, make_paged_batch, reference_attention
from pagedserve.kernels.torch_backend import TorchAttentionBackend

TOLERANCE = {torch.float32: (5e-5, 5e-5), torch.bfloat16: (2e-2, 2e-2)}


def test_a_row_round_trips_within_half_a_step_and_zero_rows_stay_zero():
    x = torch.randn(50, 3, 64) * torch.logspace(-3, 3, 50)[:, None, None]
    x[7, 1] = 0.0
    rows = quantize_rows(x)
    assert rows.dtype == torch.int8 and rows.shape == (50, 3, row_dim(64))
    back = dequantize_rows(rows)
    step = x.abs().amax(dim=-1, keepdim=True) / 127
    assert torch.all((back - x).abs() <= step / 2 * (1 + 1e-5) + 1e-30)
    assert torch.all(back[7, 1] == 0)


def garbage_cache(num_blocks: int, block_size: int, heads: int, head_dim: int) -> torch.Tensor:
    rows = quantize_rows(torch.full((num_blocks, block_size, heads, head_dim), 3e4))
    return rows


def int8_step(case: dict) -> tuple:
    batch = make_paged_batch(**case, device=torch.device("cpu"))
    shape = batch.k_cache.shape
    k8 = garbage_cache(shape[0], shape[1], shape[2], shape[3])
    v8 = garbage_cache(shape[0], shape[1], shape[2], shape[3])
    # The context as the write op would have left it: every slot a table names, quantized.
    for b, s in enumerate(batch.seq_lens_list):
        pos = torch.arange(s)
        pages = batch.block_tables[b, pos // case["block_size"]].long()
        k8[pages, pos % case["block_size"]] = quantize_rows(batch.k_cache[pages, pos % case["block_size"]])
        v8[pages, pos % case["block_size"]] = quantize_rows(batch.v_cache[pages, pos % case["block_size"]])
    return batch, k8, v8


def dequantized(batch: PagedBatch, k8: torch.Tensor, v8: torch.Tensor) -> PagedBatch:
    """The batch with the K/V the int8 cache holds: what the float32 reference must be run on."""
    return dataclasses.replace(batch, k_cache=dequantize_rows(k8), v_cache=dequantize_rows(v8))


RULES = st.sampled_from(
    [
        CAUSAL,
        AttentionRules(window=1),
        AttentionRules(window=13),
        AttentionRules(window=40, softcap=5.0),
        AttentionRules(softcap=0.7),
        AttentionRules(softcap=50.0),
    ]
)


@st.composite
def steps(draw: st.DrawFn) -> dict:
    num_kv_heads = draw(st.sampled_from([1, 2, 3]))
    group = draw(st.sampled_from([1, 3, 4]))
    seq_lens, query_lens = [], []
    for _ in range(draw(st.integers(1, 5))):
        seq_len = draw(st.integers(1, 260))
        kind = draw(st.sampled_from(["decode", "prefill", "chunk"]))
        seq_lens.append(seq_len)
        query_lens.append({"decode": 1, "prefill": seq_len, "chunk": draw(st.integers(1, seq_len))}[kind])
    return {
        "seq_lens": seq_lens,
        "query_lens": query_lens,
        "num_heads": num_kv_heads * group,
        "num_kv_heads": num_kv_heads,
        "head_dim": draw(st.sampled_from([16, 36, 64, 128])),  # 36: the scalar item only
        "block_size": draw(st.sampled_from([8, 16, 64, 128])),
        "dtype": draw(st.sampled_from([torch.float32, torch.bfloat16])),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    case=steps(), rules=RULES, op=st.sampled_from(["paged_attention_int8", "paged_attention_int8_generic"])
)
def test_the_int8_kernel_matches_the_float32_reference_on_the_dequantized_kv(
    isa: str, case: dict, rules: AttentionRules, op: str
) -> None:
    batch, k8, v8 = int8_step(case)
    meta = batch.metadata()
    scale = case["head_dim"] ** -0.5
    expected = reference_attention(dequantized(batch, k8, v8), scale, rules)
    got = torch.empty_like(batch.query)
    getattr(load_extension(KV_INT8, isa), op)(
        batch.query,
        k8,
        v8,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables,
        scale,
        rules.window or 0,
        rules.softcap or 0.0,
        got,
    )
    atol, rtol = TOLERANCE[case["dtype"]]
    torch.testing.assert_close(got.float(), expected, atol=atol, rtol=rtol)


# Decode rows of mixed lengths, a whole prefill, continued chunks (one starting inside a window).
STEP = {"seq_lens": [1, 9, 40, 77, 130, 60, 25], "query_lens": [1, 1, 1, 1, 130, 17, 25]}


RULED = [AttentionRules(window=7), AttentionRules(window=33, softcap=5.0)]


def check_rules_through_backend(int8: Int8KVBackend, rules: AttentionRules) -> None:
    """The rules applied like the float32 reference's, and not a no-op here (a window shorter than
    the context, a softcap below the scores)."""
    case = STEP | {"num_heads": 9, "num_kv_heads": 3, "head_dim": 64, "block_size": 16}
    batch, k8, v8 = int8_step(case | {"dtype": torch.float32, "seed": 7})
    batch.query *= 4
    got = int8.forward(batch.query, k8, v8, batch.metadata(), 0.125, rules)
    reference = dequantized(batch, k8, v8)
    torch.testing.assert_close(got, reference_attention(reference, 0.125, rules), atol=5e-5, rtol=5e-5)
    assert not torch.allclose(got, reference_attention(reference, 0.125), atol=1e-2)


@pytest.mark.parametrize("rules", RULED, ids=str)
def test_the_cpp_int8_backend_applies_a_layers_rules_itself(isa: str, rules: AttentionRules) -> None:
    int8 = Int8KVBackend(CppAttentionBackend(isa))
    assert int8.ops is not None
    check_rules_through_backend(int8, rules)


@pytest.mark.parametrize("rules", RULED, ids=str)
def test_the_torch_int8_backend_applies_a_layers_rules_through_the_reference(rules: AttentionRules) -> None:
    int8 = Int8KVBackend(TorchAttentionBackend())
    assert int8.ops is None
    check_rules_through_backend(int8, rules)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_int8_write_gives_the_torch_quantizers_bytes(isa: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    ops = load_extension(KV_INT8, isa)
    num_blocks, block_size, heads, head_dim = 9, 16, 3, 64
    # As the model passes them: views into fused q/k/v rows (token stride > heads * head_dim).
    fused = (torch.randn(40, 9 + 2 * heads, head_dim, generator=gen) * 5).to(dtype)
    key, value = fused[:, 9 : 9 + heads], fused[:, 9 + heads :]
    key[3, 1] = 0.0  # an all-zero row: scale 0, values 0
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:40]
    k_cache = torch.zeros(num_blocks, block_size, heads, row_dim(head_dim), dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    ops.write_kv_int8(key, value, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, heads, row_dim(head_dim)), v_cache.view(-1, heads, row_dim(head_dim))
    assert torch.equal(flat_k[slots], quantize_rows(key))
    assert torch.equal(flat_v[slots], quantize_rows(value))
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[slots] = False
    assert not flat_k[untouched].any()
    with pytest.raises(RuntimeError, match="outside the cache"):
        ops.write_kv_int8(key, value, k_cache, v_cache, slots + num_blocks * block_size)


def test_the_torch_backend_reads_int8_through_the_reference():
    # No C++ ops: the write quantizes in torch and the read dequantizes the step's blocks only.
    case = {"seq_lens": [40, 7], "query_lens": [1, 7], "num_heads": 6, "num_kv_heads": 2, "head_dim": 32}
    batch, k8, v8 = int8_step(case | {"block_size": 16, "dtype": torch.float32, "seed": 3})
    backend = Int8KVBackend(TorchAttentionBackend())
    assert backend.ops is None
    fresh_k, fresh_v = torch.zeros_like(k8), torch.zeros_like(v8)
    backend.write_kv(batch.key, batch.value, fresh_k, fresh_v, batch.slot_mapping)
    flat = fresh_k.view(-1, 2, row_dim(32))
    assert torch.equal(flat[batch.slot_mapping], quantize_rows(batch.key))
    got = backend.forward(batch.query, k8, v8, batch.metadata(), 32**-0.5)
    dense = TorchAttentionBackend().forward(
        batch.query, batch.k_cache, batch.v_cache, batch.metadata(), 32**-0.5
    )
    assert (got - dense).abs().max() < 0.05  # int8's error, against float K/V
