"""A float32 worker with narrower KV: int8 (a quarter of float32's bytes per token) or bfloat16 (half),
the same model within their rounding.

On a tiny random model (flat logits, the hard case for top-1 agreement) the logits of the prefill and
of each decode position stay within a small KL of float32 KV while both runs' greedy tokens agree (a
flip only at a near-tie), with the C++ kernel and the torch reference; the pool holds 3.2x (int8,
head_dim 16) or 2x (bfloat16) the tokens in the same bytes; settings this worker cannot honour are
refused naming the setting.
"""

from __future__ import annotations

import pytest
import torch
from worker_driver import GREEDY

from pagedserve import LLM, SamplingParams
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest


@pytest.fixture(scope="module")
def llama(tiny_model):
    return tiny_model("llama")


def logits_of(runner: ModelRunner, prompt: list[int], steps: int) -> list[tuple[int, torch.Tensor]]:
    """Prefill then greedy decode; each sampled position's (token, logits)."""
    result, logits = runner.execute_with_logits(
        Execute(
            0, new_requests=[NewRequest("r", prompt, len(prompt), 0, len(prompt), list(range(8)), GREEDY)]
        )
    )
    out = [(result.token_ids[0], logits)]
    for i in range(1, steps):
        result, logits = runner.execute_with_logits(Execute(i, cached_requests=[CachedRequest("r", 1)]))
        out.append((result.token_ids[0], logits))
    return out


def assert_close_while_on_the_same_path(reference, got, max_kl: float, tie_gap: float) -> None:
    """Each position's KL to the reference stays below max_kl while both runs have fed the same tokens.
    The tiny model's logits are flat, so a rounding may flip a greedy token, after which the contexts
    differ and nothing is compared; such a flip must be a near-tie of the reference (top-2 gap below
    tie_gap), never a confident token."""
    for (want_token, want), (have_token, have) in zip(reference, got, strict=True):
        p = torch.log_softmax(want.float(), -1)
        q = torch.log_softmax(have.float(), -1)
        kl = torch.sum(p.exp() * (p - q), -1).max().item()
        assert kl < max_kl, kl
        if have_token != want_token:
            top2 = want.float().flatten().topk(2).values
            assert (top2[0] - top2[1]).item() < tie_gap, (
                f"a confident token flipped: {want_token} -> {have_token}"
            )
            return


@pytest.mark.parametrize("kv", ["int8", "bfloat16"])
def test_narrow_kv_logits_stay_close_to_float32_kv_with_the_kernel_and_the_reference(llama, kv):
    prompt = [(7 * i) % 250 + 3 for i in range(60)]
    dense = ModelRunner(llama, block_size=16, num_blocks=8)
    reference = logits_of(dense, prompt, 20)
    for backend in ("cpp", "torch"):
        runner = ModelRunner(llama, block_size=16, num_blocks=8, kv_cache_dtype=kv, attention_backend=backend)
        assert runner.kv_cache.k[0].dtype == getattr(torch, kv) and runner.runtime["kv_cache_dtype"] == kv
        assert_close_while_on_the_same_path(
            reference, logits_of(runner, prompt, 20), max_kl=2e-3, tie_gap=0.05
        )


def test_narrow_kv_holds_more_tokens_than_float32_in_the_same_bytes(llama):
    # A row of head_dim d: 4d bytes in float32, d + 4 in int8, 2d in bfloat16. The tiny model's d = 16
    # gives int8 3.2x; SmolLM2's 64 gives 3.76x (test_kv_budget.py).
    budget = 4 << 20
    dense = ModelRunner(llama, block_size=16, kv_cache_memory=budget)
    int8 = ModelRunner(llama, block_size=16, kv_cache_memory=budget, kv_cache_dtype="int8")
    assert int8.pool_sizing.bytes_per_token * 3.2 == dense.pool_sizing.bytes_per_token
    assert 3.19 < int8.num_blocks / dense.num_blocks < 3.21
    bf16 = ModelRunner(llama, block_size=16, kv_cache_memory=budget, kv_cache_dtype="bfloat16")
    assert bf16.pool_sizing.bytes_per_token * 2 == dense.pool_sizing.bytes_per_token
    assert 1.99 < bf16.num_blocks / dense.num_blocks < 2.01


@pytest.mark.parametrize("kv", ["int8", "bfloat16"])
def test_the_engine_generates_with_narrow_kv(llama, kv):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    out = LLM(str(llama), num_blocks=64, kv_cache_dtype=kv).generate([[5, 6, 7, 8, 9]], params)
    assert len(out[0].token_ids) == 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kv_cache_dtype": "float16"}, "kv_cache_dtype float16 with a float32 model is not supported"),
        ({"kv_cache_dtype": "int8", "attention_backend": "triton"}, "int8 runs on the CPU"),
        ({"kv_cache_dtype": "bfloat16", "attention_backend": "triton"}, "float32 model runs on the CPU"),
    ],
)
def test_what_a_worker_cannot_store_is_refused_naming_the_setting(llama, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelRunner(llama, block_size=16, num_blocks=8, **kwargs)
