"""What the parity tests compare: Hugging Face transformers as the reference (eager attention, float32,
one prompt at a time so that no padding is involved) against our ModelRunner or in-process engine, on
seeded prompts.

transformers is imported only when a reference is built: test modules import this one at collection.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from pagedserve import LLM
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest, WorkerSampling

_GREEDY = WorkerSampling.of(SamplingParams(temperature=0.0), None)


def seeded_prompts(lengths: Sequence[int], seed: int = 0, top: int = 259) -> list[list[int]]:
    """One prompt per length, of token ids drawn from 3..top-1 (clear of the tiny models' special ids)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, top) for _ in range(n)] for n in lengths]


def reference_model(path: Path | str) -> Any:
    """transformers' own model of the checkpoint: eager attention (what our kernels compute), float32."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32
    )


@torch.inference_mode()
def transformers_greedy(path: Path | str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy continuation from transformers `generate`; it stops after EOS, as the
    engine does, and returns the EOS."""
    model = reference_model(path)
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


def greedy_by_arch(
    tiny_model: Callable[[str], Path], prompts_of: Callable[[str], list[list[int]]], max_tokens: int
) -> Callable[[str], tuple[Path, list[list[int]]]]:
    """arch -> (its tiny checkpoint, transformers' greedy outputs for `prompts_of(arch)`), each built
    once: a module-scoped fixture returns this, so the parametrized tests of one arch share it."""

    @functools.cache
    def get(arch: str) -> tuple[Path, list[list[int]]]:
        path = tiny_model(arch)
        return path, transformers_greedy(path, prompts_of(arch), max_tokens)

    return get


@torch.inference_mode()
def transformers_last_logits(path: Path | str, prompts: list[list[int]]) -> torch.Tensor:
    """transformers' logits at each prompt's last position, one row per prompt."""
    model = reference_model(path)
    return torch.stack([model(torch.tensor([p])).logits[0, -1] for p in prompts])


def prefill_logits(runner: ModelRunner, prompts: list[list[int]]) -> torch.Tensor:
    """Our logits at each prompt's last position: every prompt prefilled whole in one step, each on
    blocks of its own, one row per prompt."""
    step, next_block = Execute(0), 0
    for i, prompt in enumerate(prompts):
        blocks = list(range(next_block, next_block + -(-len(prompt) // runner.block_size)))
        next_block += len(blocks)
        step.new_requests.append(NewRequest(f"r{i}", prompt, len(prompt), 0, len(prompt), blocks, _GREEDY))
    _result, logits = runner.execute_with_logits(step)
    assert logits is not None  # a step that samples returns its logits
    return logits


def chunked_prefill_logits(runner: ModelRunner, prompts: list[list[int]], chunk: int) -> torch.Tensor:
    """Our logits at each prompt's last position, each prompt prefilled alone in steps of at most
    `chunk` tokens: every step has at most `chunk` rows (the quantized kernels' few-row paths)."""
    rows, step_no = [], 0
    for i, prompt in enumerate(prompts):
        blocks = list(range(-(-len(prompt) // runner.block_size)))
        logits = None
        for done in range(0, len(prompt), chunk):
            n = min(chunk, len(prompt) - done)
            step = Execute(step_no)
            if done == 0:
                step.new_requests.append(NewRequest(f"c{i}", prompt, len(prompt), 0, n, blocks, _GREEDY))
            else:
                step.cached_requests.append(CachedRequest(f"c{i}", n))
            _result, logits = runner.execute_with_logits(step)
            step_no += 1
        assert logits is not None  # the last chunk samples
        rows.append(logits[0])
        runner.execute(Execute(step_no, finished_ids=[f"c{i}"]))  # its blocks are the next prompt's
        step_no += 1
    return torch.stack(rows)


def assert_prefill_matches_transformers(
    runner: ModelRunner, path: Path | str, prompts: list[list[int]]
) -> None:
    """Our last-position logits after one prefill step are transformers' (to 1e-4, absolute)."""
    ours, theirs = prefill_logits(runner, prompts), transformers_last_logits(path, prompts)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def assert_pool_whole(llm: LLM) -> None:
    """Every block of the engine's pool is free again and its invariants hold."""
    snap = llm.block_manager.snapshot(0.0)
    assert snap["totals"]["free"] == snap["totals"]["total"], snap["totals"]
    assert snap["invariants"]["ok"], snap["invariants"]


def assert_engine_gives(
    expected: list[list[int]],
    path: Path | str,
    prompts: list[list[int]],
    max_tokens: int,
    **engine_kwargs: Any,
) -> LLM:
    """The in-process engine built with `engine_kwargs` gives `expected` as the greedy tokens of
    `prompts` and gets every block back; -> the engine, for checks of the test's own."""
    llm = LLM(str(path), **engine_kwargs)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    assert [o.token_ids for o in outs] == expected
    assert_pool_whole(llm)
    return llm


def after_a_shared_system_prompt(
    path: Path | str, questions: int, num_blocks: int
) -> tuple[LLM, list[int], list[list[int]], list[list[int]]]:
    """A 64-token system prompt (4 blocks of 16) before each of `questions` short questions, the first
    asked alone and then the rest, greedy, on an engine with prefix caching -> (that engine, per
    question its cached tokens and its tokens, the tokens of a cold engine without prefix caching)."""
    system = list(range(10, 74))
    prompts = [system + [100 + i, 101 + i, 102 + i] for i in range(questions)]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    cold = LLM(str(path), num_blocks=num_blocks, block_size=16, enable_prefix_caching=False)
    expected = [o.token_ids for o in cold.generate(prompts, params)]
    llm = LLM(str(path), num_blocks=num_blocks, block_size=16)
    outs = llm.generate(prompts[:1], params) + llm.generate(prompts[1:], params)
    return llm, [o.num_cached_tokens for o in outs], [o.token_ids for o in outs], expected
