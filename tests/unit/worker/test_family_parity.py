"""Gemma 2, Gemma 3 and Phi-3 on the paged cache match transformers token for token (float32, CPU).

The tiny checkpoints (harness/tiny_models.py, FAMILIES) have windows of 13, 11 and 29 positions against
prompts of up to 100 tokens and 32 generated ones, so sliding layers drop most of the context;
Gemma 2 soft-caps its attention and logits, Gemma 3 scales its global rotary and keeps a local base,
Phi-3 rotates half of each head, and `phi3-longrope` switches between LongRoPE's short and long factors
(prompts either past its original context of 48, or short enough never to reach it: a request that
crosses it mid-generation is recomputed by the scheduler, tests/unit/engine/test_family_engine.py).
"""

from __future__ import annotations

import pytest
from harness.parity import assert_prefill_matches_transformers, greedy_by_arch, seeded_prompts
from harness.tiny_models import FAMILIES, LONGROPE_ORIGINAL
from worker_driver import StepDriver

from pagedserve.services.worker.runner import ModelRunner

MAX_TOKENS = 32
PROMPT_LENGTHS = (1, 2, 7, 13, 16, 33, 64, 100, 17)
# phi3-longrope: no prompt that reaches position 48 while generating (see the module docstring).
LONGROPE_LENGTHS = (1, 2, 7, 13, 16, 17, 49, 64, 100)


def _prompts(arch: str) -> list[list[int]]:
    return seeded_prompts(LONGROPE_LENGTHS if arch == "phi3-longrope" else PROMPT_LENGTHS)


@pytest.fixture(scope="module")
def reference(tiny_model):
    return greedy_by_arch(tiny_model, _prompts, MAX_TOKENS)


def test_prompts_stay_clear_of_the_longrope_switch():
    for n in LONGROPE_LENGTHS:
        assert n > LONGROPE_ORIGINAL or n + MAX_TOKENS - 1 <= LONGROPE_ORIGINAL


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize(
    ("block_size", "chunk_size", "backend"), [(8, None, "cpp"), (16, 7, "torch"), (32, None, "cpp")]
)
def test_batched_greedy_generation_matches_transformers(reference, arch, block_size, chunk_size, backend):
    path, expected = reference(arch)
    runner = ModelRunner(
        path, block_size=block_size, num_blocks=2048 // block_size, attention_backend=backend
    )
    outputs = StepDriver(runner, chunk_size=chunk_size, stop_token_ids=tuple(runner.eos_token_ids)).generate(
        _prompts(arch), MAX_TOKENS
    )
    assert outputs == expected


@pytest.mark.parametrize("backend", ["cpp", "torch"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_first_step_logits_match_transformers(tiny_model, arch, backend):
    path = tiny_model(arch)
    runner = ModelRunner(path, block_size=16, num_blocks=128, attention_backend=backend)
    assert_prefill_matches_transformers(runner, path, _prompts(arch))


def test_the_windows_and_caps_are_what_the_configs_say(tiny_model):
    """The switches the parity above relies on really are on (else it would prove less)."""
    gemma2 = ModelRunner(tiny_model("gemma2"), block_size=16, num_blocks=16).model_config
    assert gemma2.layer_windows == (13, None, 13)
    assert (gemma2.attn_logit_softcap, gemma2.final_logit_softcap) == (4.0, 5.0)
    assert gemma2.scale == 20**-0.5 and gemma2.hidden_act == "gelu_pytorch_tanh"
    gemma3 = ModelRunner(tiny_model("gemma3"), block_size=16, num_blocks=16).model_config
    assert gemma3.layer_windows == (11, 11, None, 11) and gemma3.attn_logit_softcap is None
    assert gemma3.sliding_rope is not None and gemma3.sliding_rope.theta == 100.0
    assert (gemma3.rope.rope_type, gemma3.rope.theta) == ("linear", 5000.0)
    phi3 = ModelRunner(tiny_model("phi3-longrope"), block_size=16, num_blocks=16).model_config
    assert phi3.layer_windows == (29, 29) and phi3.rope.rope_type == "longrope"
    assert phi3.rope.rotary_dim(phi3.head_dim) == 6 and phi3.rope.long_from == LONGROPE_ORIGINAL
