"""The in-process engine on the real SmolLM2-135M-Instruct (float32) equals transformers greedy, with
every mechanism at work at once: a pool small enough to preempt, a 32-token budget that chunks each
prompt, pipeline depth 3, and a shared system prompt served from the prefix cache."""

from __future__ import annotations

import pytest
import torch
from harness.bundled_reference import transformers_bundled

from pagedserve import LLM, SamplingParams

pytestmark = pytest.mark.slow

MAX_TOKENS = 40  # past EOS on both sides (ignore_eos / no eos_token_id): long enough to need preemption
QUESTIONS = (
    "What is the capital of France?",
    "Name a prime number.",
    "What colour is the sky?",
    "Say hello in Spanish.",
    "What is 2 + 2?",
    "Name a planet.",
    "What do bees make?",
    "Which ocean is the largest?",
)


@pytest.fixture(scope="module")
def prompts_and_reference():
    tokenizer, model = transformers_bundled()
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        for q in QUESTIONS
    ]
    model.generation_config.eos_token_id = None  # the engine side runs with ignore_eos
    reference = []
    for p in prompts:
        ids = torch.tensor([list(p)])
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_TOKENS
            )
        reference.append(out[0, ids.shape[1] :].tolist())
    return [list(p) for p in prompts], reference


def test_engine_on_smollm2_matches_transformers_under_preemption_chunking_and_depth_3(prompts_and_reference):
    prompts, reference = prompts_and_reference
    # The dense float32 load: transformers runs it so (the default keeps the GGUF's Q4_1 where it can).
    dense = {"dtype": "float32", "quantization": "none"}
    llm = LLM(
        "smollm2-135m", block_size=16, num_blocks=8, max_num_batched_tokens=32, pipeline_depth=3, **dense
    )
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outs] == reference
    assert llm.scheduler.stats.preemptions > 0
    assert sum(o.num_cached_tokens for o in outs) > 0  # the chat template's system prompt was shared
    snap = llm.block_manager.snapshot(0.0)
    assert snap["totals"]["free"] == snap["totals"]["total"] and snap["invariants"]["ok"]
