"""A worker with int8 KV: a quarter of float32's bytes per token, the same model within int8's error.

On a tiny random model (flat logits, the hard case for top-1 agreement) the logits of every prefill
and decode position stay within a small KL of float32 KV; the pool holds 3.76x the tokens per byte;
settings this worker cannot honour are refused naming the setting.
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


def logits_of(runner: ModelRunner, prompt: list[int], steps: int) -> list[torch.Tensor]:
    """Prefill then greedy decode; the logits of each sampled position."""
    result, logits = runner.execute_with_logits(
        Execute(
            0, new_requests=[NewRequest("r", prompt, len(prompt), 0, len(prompt), list(range(8)), GREEDY)]
        )
    )
    out = [logits]
    for i in range(1, steps):
        result, logits = runner.execute_with_logits(Execute(i, cached_requests=[CachedRequest("r", 1)]))
        out.append(logits)
    return out


def test_int8_kv_logits_stay_close_to_float32_kv_with_the_kernel_and_the_reference(llama):
    prompt = [(7 * i) % 250 + 3 for i in range(60)]
    dense = ModelRunner(llama, block_size=16, num_blocks=8)
    reference = logits_of(dense, prompt, 20)
    for backend in ("cpp", "torch"):
        runner = ModelRunner(
            llama, block_size=16, num_blocks=8, kv_cache_dtype="int8", attention_backend=backend
        )
        assert runner.kv_cache.k[0].dtype == torch.int8 and runner.runtime["kv_cache_dtype"] == "int8"
        got = logits_of(runner, prompt, 20)
        for want, have in zip(reference, got, strict=True):
            p = torch.log_softmax(want.float(), -1)
            q = torch.log_softmax(have.float(), -1)
            kl = torch.sum(p.exp() * (p - q), -1).max().item()
            assert kl < 2e-3, kl


def test_int8_kv_holds_4_d_over_d_plus_4_the_tokens_of_float32_in_the_same_bytes(llama):
    # A row of head_dim d: 4d bytes in float32, d + 4 in int8. The tiny model's d = 16 gives 3.2x;
    # SmolLM2's 64 gives 3.76x (test_kv_budget.py).
    budget = 4 << 20
    dense = ModelRunner(llama, block_size=16, kv_cache_memory=budget)
    int8 = ModelRunner(llama, block_size=16, kv_cache_memory=budget, kv_cache_dtype="int8")
    assert int8.pool_sizing.bytes_per_token * 3.2 == dense.pool_sizing.bytes_per_token
    assert 3.19 < int8.num_blocks / dense.num_blocks < 3.21


def test_the_engine_generates_with_int8_kv(llama):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    out = LLM(str(llama), num_blocks=64, kv_cache_dtype="int8").generate([[5, 6, 7, 8, 9]], params)
    assert len(out[0].token_ids) == 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kv_cache_dtype": "bfloat16"}, "kv_cache_dtype bfloat16 with a float32 model is not supported"),
        ({"kv_cache_dtype": "int8", "attention_backend": "triton"}, "int8 runs on the CPU"),
    ],
)
def test_what_a_worker_cannot_store_is_refused_naming_the_setting(llama, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelRunner(llama, block_size=16, num_blocks=8, **kwargs)
