"""The simulated runner (a worker with no model): the Execute semantics of a real one, fake tokens
that a recompute reproduces, and a step that takes the simulated time."""

from __future__ import annotations

import json

import pytest
from worker_driver import GREEDY

from pagedserve.services.worker import simulated
from pagedserve.services.worker.simulated import FIRST_TOKEN, SimulatedRunner
from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest


def runner(tmp_path, step_ms: float = 1.0) -> SimulatedRunner:
    (tmp_path / "config.json").write_text(
        json.dumps({"vocab_size": 100, "max_position_embeddings": 256, "eos_token_id": 2})
    )
    return SimulatedRunner(tmp_path, step_ms=step_ms, block_size=16, num_blocks=8)


def new(rid: str, tokens: list[int], scheduled: int, computed: int = 0) -> NewRequest:
    return NewRequest(rid, tokens, len(tokens), computed, scheduled, [0], GREEDY)


def test_it_reports_the_pool_and_limits_like_a_worker(tmp_path):
    r = runner(tmp_path)
    assert (r.num_blocks, r.block_size, r.vocab_size, r.max_model_len, r.eos_token_ids) == (
        8,
        16,
        100,
        256,
        [2],
    )


def test_a_prefill_chunk_short_of_the_prompt_samples_nothing_then_decodes_go_on(tmp_path):
    r = runner(tmp_path)
    assert r.execute(Execute(0, new_requests=[new("a", [5, 6, 7, 8], 2)])).request_ids == []
    first = r.execute(Execute(1, cached_requests=[CachedRequest("a", 2)]))
    second = r.execute(Execute(2, cached_requests=[CachedRequest("a", 1)]))
    assert first.request_ids == second.request_ids == ["a"]
    assert all(FIRST_TOKEN <= t < 100 for t in first.token_ids + second.token_ids)


def test_a_recompute_gives_the_same_tokens(tmp_path):
    a, b = runner(tmp_path), runner(tmp_path)
    out_a = [a.execute(Execute(0, new_requests=[new("x", [9, 10, 11], 3)])).token_ids[0]]
    for step in range(1, 5):
        out_a += a.execute(Execute(step, cached_requests=[CachedRequest("x", 1)])).token_ids
    # Recomputed from prompt + the first two outputs, as after a preemption.
    tokens = [9, 10, 11, *out_a[:2]]
    out_b = b.execute(Execute(0, new_requests=[new("x", tokens, len(tokens))])).token_ids
    assert out_b == [out_a[2]]


def test_finished_requests_are_forgotten_and_unknown_ones_refused(tmp_path):
    r = runner(tmp_path)
    r.execute(Execute(0, new_requests=[new("a", [5, 6], 2)]))
    r.execute(Execute(1, finished_ids=["a"]))
    assert r.requests == {}
    with pytest.raises(KeyError, match="does not hold"):
        r.execute(Execute(2, cached_requests=[CachedRequest("a", 1)]))


def test_block_ids_outside_the_pool_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"block ids must be in \[0, 8\)"):
        runner(tmp_path).execute(Execute(0, new_requests=[NewRequest("a", [5], 1, 0, 1, [8], GREEDY)]))


def test_a_step_takes_the_simulated_time(tmp_path, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(simulated.time, "sleep", slept.append)  # the clock of the code, not the wall
    r = runner(tmp_path, step_ms=30.0)
    r.execute(Execute(0, new_requests=[new("a", [5, 6], 2)]))
    assert len(slept) == 1 and 0.0 < slept[0] <= 0.03  # the rest of the 30 ms the step's work left
    r.execute(Execute(1))  # nothing scheduled: no model time
    assert len(slept) == 1
