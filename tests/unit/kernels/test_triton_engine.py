"""The whole engine on the Triton backend (CPU interpreter) gives the torch backend's greedy tokens."""

from __future__ import annotations

import pytest
import triton_env  # noqa: F401  (must come before the kernels are imported)

from pagedserve import LLM, SamplingParams


def _greedy_tokens(path: str, backend: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy tokens on one attention backend; 24 tokens a step, so prefill is chunked."""
    llm = LLM(path, attention_backend=backend, num_blocks=64, block_size=16, max_num_batched_tokens=24)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)]


def test_engine_with_triton_backend_matches_torch_backend(tiny_model):
    path = str(tiny_model("qwen3"))  # GQA 4:1 and head_dim 32
    prompts = [[5, 9, 33, 70, 2 + i] * (1 + 3 * i) for i in range(4)]  # 5..50 tokens: prefill, then decode
    torch_out = _greedy_tokens(path, "torch", prompts, max_tokens=6)
    assert _greedy_tokens(path, "triton", prompts, max_tokens=6) == torch_out


@pytest.mark.parametrize("arch", ["gemma2", "phi3"])
def test_sliding_windows_and_softcaps_on_triton_match_the_torch_backend(tiny_model, arch):
    """Gemma 2 (window 13 on alternate layers, attention softcap, head_dim 24) and Phi-3 (window 29 in
    every layer, head_dim 12) with prompts longer than their windows, prefill chunked."""
    path = str(tiny_model(arch))
    prompts = [[7 + (5 * j + i) % 250 for j in range(n)] for i, n in enumerate((9, 31, 50))]
    torch_out = _greedy_tokens(path, "torch", prompts, max_tokens=6)
    assert _greedy_tokens(path, "triton", prompts, max_tokens=6) == torch_out


def test_moe_engine_with_triton_backend_matches_torch_backend(tiny_model):
    """OLMoE (whole-projection q/k norms, clip_qkv, 7 experts top-3): the MoE block is the same code
    on either backend; the attention around it runs Triton's kernels."""
    path = str(tiny_model("olmoe"))
    prompts = [[7, 19, 40, 3 + i] * (1 + 4 * i) for i in range(3)]
    torch_out = _greedy_tokens(path, "torch", prompts, max_tokens=5)
    assert _greedy_tokens(path, "triton", prompts, max_tokens=5) == torch_out
