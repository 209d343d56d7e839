"""What a fault-free run would say: seeded random prompts and their greedy outputs from the
in-process engine, the reference the chaos tests compare a deployment's outputs with."""

from __future__ import annotations

import random
from pathlib import Path

from pagedserve import LLM, SamplingParams


def random_prompts(n: int, seed: int, max_len: int) -> list[list[int]]:
    """n prompts of 4..max_len-1 token ids in 3..299 (clear of the tiny models' special ids)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(rng.randrange(4, max_len))] for _ in range(n)]


def greedy_outputs(model_path: Path | str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy tokens, EOS ignored, from the in-process engine with ample memory."""
    llm = LLM(str(model_path), num_blocks=512)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)]
