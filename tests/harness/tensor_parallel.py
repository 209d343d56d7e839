"""Greedy tokens of a tensor-parallel worker group, through a real one-worker deployment, beside the
in-process engine's (one process) for the same prompts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from harness.deployment import assert_no_leak, start, stream_greedy
from pagedserve import LLM, SamplingParams


async def _ignore(_seen: int) -> None:
    pass


def one_process_greedy(
    model: Path | str, prompts: list[list[int]], max_tokens: int, **overrides: Any
) -> list[list[int]]:
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in LLM(str(model), num_blocks=64, **overrides).generate(prompts, greedy)]


def group_greedy(
    model: Path | str, log_dir: Path, size: int, prompts: list[list[int]], max_tokens: int, **overrides: Any
) -> list[list[int]]:
    """The final tokens of each prompt from a deployment whose one worker runs `size` ranks; every
    block is back in its pool once they finish."""
    sup = start(model, workers=1, log_dir=log_dir, tensor_parallel_size=size, num_blocks=64, **overrides)
    try:
        got = asyncio.run(stream_greedy(sup.front_endpoint, prompts, max_tokens, f"tp{size}", _ignore))
        assert_no_leak(sup, 1)
        return [final for _, final in got]
    finally:
        sup.stop()
