"""ModelRunner.execute follows the step semantics of shared/protocol/step.py."""

from __future__ import annotations

import random

import pytest
import torch
from worker_driver import GREEDY, StepDriver, sampling

from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.protocol.step import CachedRequest, Execute, Fork, NewRequest


def _prompts(seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 259) for _ in range(n)] for n in (5, 23, 40, 1, 64, 17)]


@pytest.fixture(scope="module")
def llama(tiny_model):
    return tiny_model("llama")


def _runner(path, **kwargs) -> ModelRunner:
    return ModelRunner(
        path, block_size=kwargs.pop("block_size", 8), num_blocks=kwargs.pop("num_blocks", 256), **kwargs
    )


def test_pipelined_steps_produce_the_same_tokens_as_lockstep(llama):
    """With depth 2-3 the driver sends decodes before it has seen the token they consume, and keeps
    scheduling requests that already stopped (their extra tokens are dropped)."""
    prompts = _prompts()
    lockstep = StepDriver(_runner(llama), chunk_size=7).generate(prompts, 24)
    stop = lockstep[2][9]  # request 2 stops on its 10th token; others may stop earlier on it too
    expected = StepDriver(_runner(llama), chunk_size=7, stop_token_ids=(stop,)).generate(prompts, 24)
    assert len(expected[2]) <= 10 and expected[2][-1] == stop
    for depth in (2, 3):
        driver = StepDriver(_runner(llama), chunk_size=7, depth=depth, stop_token_ids=(stop,))
        assert driver.generate(prompts, 24) == expected


def test_seeded_sampling_is_the_same_at_every_pipeline_depth(llama):
    params = sampling(temperature=1.0, top_p=0.9, seed=1234)
    outputs = [
        StepDriver(_runner(llama), chunk_size=16, depth=depth).generate(_prompts(), 12, params)
        for depth in (1, 2, 3)
    ]
    assert outputs[0] == outputs[1] == outputs[2]


def test_prefix_cache_hit_reads_the_shared_blocks_and_continues_identically(llama):
    prompt = _prompts()[2]  # 40 tokens = 5 full blocks of 8
    runner = _runner(llama)
    first = runner.execute(
        Execute(0, new_requests=[NewRequest("a", prompt, 40, 0, 40, [0, 1, 2, 3, 4], GREEDY)])
    )
    # "b" has the same prompt: its first 4 blocks are a's (a prefix-cache hit); it computes the rest.
    hit = NewRequest("b", prompt, 40, 32, 8, [0, 1, 2, 3, 9], GREEDY)
    second = runner.execute(Execute(1, new_requests=[hit], cached_requests=[CachedRequest("a", 1, [5])]))
    assert second.request_ids == ["b", "a"]
    assert second.token_ids[0] == first.token_ids[0]
    third = runner.execute(Execute(2, cached_requests=[CachedRequest("a", 1), CachedRequest("b", 1, [10])]))
    # b's second token (its first decode) is a's second token.
    assert third.request_ids == ["a", "b"] and third.token_ids[1] == second.token_ids[1]


def _fork_run(path, forked: bool) -> dict[str, list[int]]:
    """Three completions of one prompt with seeds 1, 2, 3: as one parent and two forked children
    sharing its blocks (copy-on-write), or as three independent requests."""
    prompt = _prompts()[1]  # 23 tokens: block 2 of 8 is shared and only partly filled
    runner = ModelRunner(path, block_size=8, num_blocks=64)
    params = {rid: sampling(temperature=1.0, seed=seed) for rid, seed in (("p", 1), ("c1", 2), ("c2", 3))}
    tables = {"p": [0, 1, 2]}
    step = Execute(0, new_requests=[NewRequest("p", prompt, 23, 0, 23, [0, 1, 2], params["p"])])
    if forked:
        step.forks = [Fork("p", "c1", 2), Fork("p", "c2", 3)]
        tables.update(c1=[0, 1, 2], c2=[0, 1, 2])
    else:
        tables.update(c1=[3, 4, 5], c2=[6, 7, 8])
        step.new_requests += [NewRequest(r, prompt, 23, 0, 23, tables[r], params[r]) for r in ("c1", "c2")]
    result = runner.execute(step)
    outputs = {rid: [tok] for rid, tok in zip(result.request_ids, result.token_ids, strict=True)}
    if forked:
        assert runner.requests["c1"].sampling.seed == 2
    next_block = 20
    for i in range(1, 12):
        step = Execute(i)
        for rid, table in tables.items():
            new, replaced = [], []
            position = 23 + i - 1
            if position % 8 == 0:
                new = [next_block]
                next_block += 1
                table.append(new[0])
            elif forked and i == 1 and rid != "p":
                # The first write into the shared, partly filled block 2 copies it first.
                replaced = [(2, next_block)]
                step.copies.append((2, next_block))
                table[2] = next_block
                next_block += 1
            step.cached_requests.append(CachedRequest(rid, 1, new, replaced))
        result = runner.execute(step)
        for rid, tok in zip(result.request_ids, result.token_ids, strict=True):
            outputs[rid].append(tok)
    return outputs


def test_forked_children_sample_like_independent_requests_with_their_seeds(llama):
    forked = _fork_run(llama, forked=True)
    independent = _fork_run(llama, forked=False)
    assert forked == independent
    assert forked["c1"] != forked["c2"]  # the seeds matter, so the fork really used its own


def test_a_fork_of_a_request_that_samples_nothing_is_refused(llama):
    runner = _runner(llama)
    prompt = _prompts()[2]
    step = Execute(0, new_requests=[NewRequest("p", prompt, 40, 0, 16, [0, 1, 2, 3, 4], GREEDY)])
    step.forks = [Fork("p", "c", 5)]
    with pytest.raises(ValueError, match="samples nothing"):
        runner.execute(step)


def test_a_prefill_chunk_that_stops_short_of_the_prompt_end_samples_nothing(llama):
    runner = _runner(llama)
    prompt = _prompts()[2]
    result = runner.execute(
        Execute(0, new_requests=[NewRequest("r", prompt, 40, 0, 16, [0, 1, 2, 3, 4], GREEDY)])
    )
    assert result.request_ids == [] and result.token_ids == []
    result = runner.execute(Execute(1, cached_requests=[CachedRequest("r", 24)]))
    assert result.request_ids == ["r"]


def test_finished_requests_are_forgotten(llama):
    runner = _runner(llama)
    runner.execute(Execute(0, new_requests=[NewRequest("r", [5, 6, 7], 3, 0, 3, [0], GREEDY)]))
    result = runner.execute(Execute(1, finished_ids=["r"]))
    assert result.request_ids == [] and "r" not in runner.requests
    with pytest.raises(KeyError, match="does not hold"):
        runner.execute(Execute(2, cached_requests=[CachedRequest("r", 1)]))


def test_scheduling_a_token_the_worker_never_sampled_is_an_error(llama):
    runner = _runner(llama)
    runner.execute(Execute(0, new_requests=[NewRequest("r", [5, 6, 7, 8], 4, 0, 2, [0], GREEDY)]))
    with pytest.raises(ValueError, match="knows only 4 tokens"):
        runner.execute(Execute(1, cached_requests=[CachedRequest("r", 3)]))


def test_a_block_table_too_short_for_the_tokens_is_an_error(llama):
    runner = _runner(llama)
    with pytest.raises(ValueError, match="need 2 blocks"):
        runner.execute(Execute(0, new_requests=[NewRequest("r", list(range(3, 15)), 12, 0, 12, [0], GREEDY)]))


def test_block_ids_outside_the_pool_are_refused(llama):
    runner = _runner(llama, num_blocks=4)
    with pytest.raises(ValueError, match=r"block ids must be in \[0, 4\)"):
        runner.execute(Execute(0, new_requests=[NewRequest("r", [5, 6], 2, 0, 2, [4], GREEDY)]))


def test_step_result_reports_its_timings(llama):
    runner = _runner(llama)
    result = runner.execute(Execute(0, new_requests=[NewRequest("r", [5, 6, 7], 3, 0, 3, [0], GREEDY)]))
    assert set(result.timings) >= {"prepare_s", "forward_s", "sample_s", "step_s"}
    assert all(v >= 0 for v in result.timings.values())


def test_pool_size_comes_from_the_memory_budget(llama):
    # llama tiny: 3 layers, 2 KV heads of 16 dims; a block of 16 tokens is 2*3*16*2*16*4 bytes.
    per_block = 2 * 3 * 16 * 2 * 16 * 4
    runner = ModelRunner(llama, block_size=16, kv_cache_memory=per_block * 10 + 5)
    assert runner.num_blocks == 10 and runner.block_size == 16
    assert runner.kv_cache.k[0].shape == (10, 16, 2, 16)
    assert runner.vocab_size == 320 and runner.max_model_len == 512 and runner.eos_token_ids == [2]
    with pytest.raises(ValueError, match="holds no block"):
        ModelRunner(llama, block_size=16, kv_cache_memory=per_block - 1)


def test_bfloat16_model_loads_and_generates(llama):
    # allow_slow_dtype: where the CPU has no native bf16 a server refuses it (test_cpu_dtype.py); the
    # model code is still checked.
    runner = _runner(llama, dtype="bfloat16", allow_slow_dtype=True)
    assert runner.model.embed_tokens.weight.dtype == torch.bfloat16
    assert runner.kv_cache.k[0].dtype == torch.bfloat16
    outputs = StepDriver(runner, chunk_size=16).generate(_prompts(), 8)
    assert all(len(o) == 8 and all(0 <= t < runner.vocab_size for t in o) for o in outputs)
    prompt = _prompts()[4]
    step = Execute(0, new_requests=[NewRequest("r", prompt, 64, 0, 64, list(range(8)), GREEDY)])
    _result, logits = runner.execute_with_logits(step)
    _result, logits32 = _runner(llama).execute_with_logits(step)
    assert logits is not None and logits32 is not None and torch.isfinite(logits).all()
    assert (logits.float() - logits32).abs().max() < 0.25 * logits32.abs().max()


def test_copies_naming_blocks_outside_the_pool_are_refused(llama):
    runner = _runner(llama, num_blocks=4)
    with pytest.raises(ValueError, match=r"copy-on-write.*\[0, 4\)"):
        runner.execute(Execute(0, copies=[(1, 9)]))
