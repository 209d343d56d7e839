"""Prepacked linear weights (services/worker/layers/packed_linear.py): the packed GEMM is F.linear."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from worker_driver import GREEDY, StepDriver

from pagedserve.services.worker.layers.packed_linear import (
    PackedLinear,
    pack_linear,
    packing_available,
    prepack_linears,
    row_bucket,
)
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.step import Execute, NewRequest

CPU = torch.device("cpu")
BF16_PACKING = packing_available(torch.bfloat16, CPU)
needs_packing = pytest.mark.skipif(
    not BF16_PACKING,
    reason="no packed oneDNN bf16 GEMM here (this torch lacks it, or the CPU lacks avx_ne_convert and "
    "AVX-512 BW/VL/DQ: then the model keeps dense weights, test_no_bf16_packing_where_onednn_has_no_bf16_path)",
)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 128),
    in_features=st.sampled_from([16, 64, 96, 576]),
    out_features=st.sampled_from([8, 48, 320, 960]),
    bias=st.booleans(),
    # float32 packs on every CPU oneDNN runs on; bfloat16 only where oneDNN has a bf16 path.
    dtype=st.sampled_from([torch.bfloat16, torch.float32] if BF16_PACKING else [torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_packed_linear_equals_f_linear_for_any_batch(rows, in_features, out_features, bias, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(out_features, in_features, generator=gen) * 0.1).to(dtype)
    b = (torch.randn(out_features, generator=gen) * 0.1).to(dtype) if bias else None
    packed = PackedLinear(weight, b)
    # One packed weight serves every row count: the decode batch changes each step.
    for m in (rows, 1, rows + 3):
        x = torch.randn(m, in_features, generator=gen).to(dtype)
        expected = F.linear(x, weight, b)
        got = packed(x)
        assert got.shape == expected.shape and got.dtype == dtype
        if dtype == torch.bfloat16:
            assert torch.equal(got, expected)  # both oneDNN: the same bits
        else:
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if BF16_PACKING else [torch.float32])
@pytest.mark.parametrize("rows", [10, 17])  # 17 is padded to its bucket, 10 is not
def test_packed_linear_reads_a_strided_input(dtype, rows):
    weight = torch.randn(32, 64).to(dtype)
    x = torch.randn(64, rows).to(dtype).t()  # not contiguous
    got, expected = PackedLinear(weight, None)(x), F.linear(x, weight)
    if dtype == torch.bfloat16:
        assert torch.equal(got, expected)
    else:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_no_packing_where_the_op_is_not_available(monkeypatch):
    assert not packing_available(torch.bfloat16, torch.device("meta"))
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert pack_linear(torch.randn(4, 4).bfloat16()) is None
    model = nn.Sequential(nn.Linear(4, 4).bfloat16())
    assert prepack_linears(model) == 0 and isinstance(model[0], nn.Linear)


@pytest.mark.skipif(BF16_PACKING, reason="oneDNN has a bf16 path on this CPU: packing is used")
def test_no_bf16_packing_where_onednn_has_no_bf16_path(tiny_model):
    """Where oneDNN's bf16 reorder would raise, the linears stay dense and the model still runs."""
    assert pack_linear(torch.randn(4, 4).bfloat16()) is None
    model = nn.Sequential(nn.Linear(4, 4).bfloat16())
    assert prepack_linears(model) == 0 and isinstance(model[0], nn.Linear)
    runner = _runner(tiny_model("llama"), dtype="bfloat16", allow_slow_dtype=True)
    assert runner.num_prepacked == 0
    assert len(StepDriver(runner, chunk_size=16).generate([[5, 6, 7]], 3)[0]) == 3


@needs_packing
def test_prepack_replaces_every_linear_and_keeps_the_outputs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Sequential(nn.Linear(16, 4, bias=False))).bfloat16()
    x = torch.randn(5, 8).bfloat16()
    expected = model(x)
    assert prepack_linears(model) == 2
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert torch.equal(model(x), expected)


@pytest.fixture(scope="module")
def llama(tiny_model):
    return tiny_model("llama")


def _runner(path, **kwargs) -> ModelRunner:
    return ModelRunner(path, block_size=8, num_blocks=256, **kwargs)


@needs_packing
def test_bf16_runner_prepacks_every_projection_and_the_tied_head(llama):
    runner = _runner(llama, dtype="bfloat16")
    layers = runner.model_config.num_layers
    assert runner.num_prepacked == 4 * layers + 1  # qkv, o, gate/up, down per layer + the LM head


@needs_packing
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_bf16_logits_are_the_same_bits_with_and_without_prepacking(tiny_model, arch):
    path = tiny_model(arch)
    prompt = [3 + (i * 7) % 250 for i in range(40)]
    step = Execute(0, new_requests=[NewRequest("r", prompt, 40, 0, 40, list(range(5)), GREEDY)])
    _, packed = _runner(path, dtype="bfloat16").execute_with_logits(step)
    _, dense = _runner(path, dtype="bfloat16", prepack_weights=False).execute_with_logits(step)
    assert packed is not None and dense is not None
    assert torch.equal(packed, dense)


def test_float32_runner_packs_every_projection_and_the_tied_head(llama):
    runner = _runner(llama)
    layers = runner.model_config.num_layers
    assert runner.num_prepacked == 4 * layers + 1  # qkv, o, gate/up, down per layer + the tied head
    assert isinstance(runner.model.layers[0].self_attn.qkv_proj, PackedLinear)
    assert runner.runtime["linears"] == "onednn-packed"


def test_float32_packed_model_matches_the_dense_one_but_for_rounding(llama):
    """oneDNN sums in another order than MKL's sgemm: logits ~1e-6 apart, the same greedy tokens."""
    prompt = [3 + (i * 7) % 250 for i in range(40)]
    step = Execute(0, new_requests=[NewRequest("r", prompt, 40, 0, 40, list(range(5)), GREEDY)])
    _, packed = _runner(llama).execute_with_logits(step)
    _, dense = _runner(llama, prepack_weights=False).execute_with_logits(step)
    assert packed is not None and dense is not None
    torch.testing.assert_close(packed, dense, rtol=0, atol=1e-5)
    prompts = [[5, 6, 7], [9] * 20, list(range(3, 40))]
    assert StepDriver(_runner(llama), chunk_size=16).generate(prompts, 8) == StepDriver(
        _runner(llama, prepack_weights=False), chunk_size=16
    ).generate(prompts, 8)


def test_row_buckets_are_few_cover_every_count_and_pad_little():
    buckets = {row_bucket(rows) for rows in range(1, 2049)}
    assert len(buckets) <= 45  # one oneDNN primitive per bucket and weight shape, not per row count
    for rows in range(1, 2049):
        bucket = row_bucket(rows)
        assert rows <= bucket < rows * 1.25 + 1
        assert row_bucket(bucket) == bucket
    assert [row_bucket(r) for r in (1, 16, 17, 33, 64, 65, 257)] == [1, 16, 20, 40, 64, 80, 320]


def test_padded_rows_give_the_unpadded_outputs():
    torch.manual_seed(0)
    weight, bias = torch.randn(40, 24), torch.randn(40)
    packed = PackedLinear(weight, bias)
    for rows in (17, 33, 100):  # each padded up to its bucket
        x = torch.randn(rows, 24)
        got = packed(x)
        assert got.shape == (rows, 40)
        torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_packed_memory_stops_growing_once_every_bucket_was_seen():
    """What the soak saw before rows were bucketed: RSS up with every new decode batch size."""
    packed = PackedLinear(torch.randn(960, 576), None)

    def rss_mib() -> float:
        status = Path("/proc/self/status").read_text().splitlines()
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024

    for rows in range(1, 300):  # every bucket up to 384 rows
        packed(torch.randn(rows, 576))
    before = rss_mib()
    for _ in range(3):
        for rows in range(1, 300):
            packed(torch.randn(rows, 576))
    assert rss_mib() - before < 8.0


@needs_packing
def test_prepacking_switched_off_leaves_the_bf16_model_dense_and_generating(llama):
    runner = _runner(llama, dtype="bfloat16", prepack_weights=False)
    assert runner.num_prepacked == 0
    outputs = StepDriver(runner, chunk_size=16).generate([[5, 6, 7], [9] * 20], 6)
    assert [len(o) for o in outputs] == [6, 6]
