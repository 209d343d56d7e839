"""The services as real processes over real sockets: 2 workers, the SDK, the ops endpoints."""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest
from harness.deployment import blocks, get_json, get_text, start, wait_for, workers_ready
from prometheus_client.parser import text_string_to_metric_families

from pagedserve import LLM, AsyncClient, SamplingParams

NUM_REQUESTS = 32
MAX_TOKENS = 10


def workload() -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(3, 300) for _ in range(rng.randrange(1, 60))] for _ in range(NUM_REQUESTS)]


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def in_process(model_path) -> list[list[int]]:
    llm = LLM(str(model_path), num_blocks=256)
    return [
        o.token_ids for o in llm.generate(workload(), SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    ]


async def stream_all(endpoint: str) -> list[list[int]]:
    async with AsyncClient(endpoint, timeout_s=120) as client:

        async def one(i: int, prompt: list[int]) -> list[int]:
            tokens: list[int] = []
            stream = client.stream(
                prompt_token_ids=prompt, max_tokens=MAX_TOKENS, temperature=0.0, request_id=f"req-{i}"
            )
            async for delta in stream:
                tokens.extend(delta.token_ids)
            assert tokens == stream.result.token_ids  # the stream and the final result agree
            return tokens

        return await asyncio.gather(*(one(i, p) for i, p in enumerate(workload())))


# Under `pagedserve chaos stress --kill-worker-every S` a worker may be down for most of a test: what
# came back must still be exact and the pool whole, but which workers served is no longer the claim.
WORKERS_KILLED = bool(os.environ.get("PAGEDSERVE_STRESS_KILL_EVERY_S"))


def wait_pool_whole(sup, pools: int, timeout_s: float = 10.0) -> dict:
    """The block manager's view once `pools` pools are registered and all free (or at the deadline).
    A worker killed by the stress lane registers a new pool when it is back."""
    deadline = time.monotonic() + (90.0 if WORKERS_KILLED else timeout_s)
    while True:
        snap = blocks(sup)
        live = snap["pools"]
        whole = len(live) == pools and all(p["totals"]["free"] == p["totals"]["total"] for p in live)
        if whole or time.monotonic() > deadline:
            return snap
        time.sleep(0.2)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_streamed_requests_through_two_workers_match_the_in_process_engine(
    model_path, in_process, tmp_path, depth
):
    sup = start(model_path, workers=2, log_dir=tmp_path, pipeline_depth=depth)
    try:
        wanted = 1 if WORKERS_KILLED else 2
        assert wait_for(lambda: len(workers_ready(sup)) >= wanted, 90), workers_ready(sup)
        got = asyncio.run(stream_all(sup.front_endpoint))
        assert got == in_process
        snap = wait_pool_whole(sup, pools=2)
        assert len(snap["pools"]) == 2
        assert snap["totals"]["free"] == snap["totals"]["total"]
        assert snap["totals"]["leaked"] == 0
        assert snap["invariants"]["ok"], snap["invariants"]
        families = {
            f.name: f for f in text_string_to_metric_families(get_text(f"{sup.scheduler_ops_url}/metrics"))
        }
        # Step time per worker name, which outlives a restart (a restarted worker's pool is new and
        # empty, so cached blocks would not show who served when the stress lane kills workers).
        busy = {
            s.labels["worker_id"]: s.value
            for s in families["pagedserve_worker_busy_seconds"].samples
            if s.name.endswith("_total")
        }
        if not WORKERS_KILLED:
            assert sorted(w for w, s in busy.items() if s > 0) == ["worker-0", "worker-1"], busy
        assert "pagedserve_tokens" in families and "pagedserve_time_to_first_token_seconds" in families
        bm_families = {
            f.name for f in text_string_to_metric_families(get_text(f"{sup.block_manager_ops_url}/metrics"))
        }
        assert "pagedserve_bm_blocks" in bm_families
    finally:
        sup.stop()


def test_the_scheduler_shows_how_each_worker_runs_its_model(model_path, tmp_path):
    """`/workers` on the scheduler's ops port: each worker's dtype, backends and the CPU ISA path of
    every C++ op, as the worker announced them; on a CPU with a compiler none is the torch fallback."""
    from pagedserve.kernels.cpu.isa import runnable_isas

    sup = start(model_path, workers=1, log_dir=tmp_path, pipeline_depth=2)
    try:
        deadline = time.monotonic() + 30
        while not workers_ready(sup) and time.monotonic() < deadline:
            time.sleep(0.2)
        (worker,) = get_json(f"{sup.scheduler_ops_url}/workers")["workers"]
        runtime = worker["runtime"]
        assert worker["active"] and runtime["dtype"] == "float32" and runtime["attention_backend"] == "cpp"
        paths = {op: runtime[f"isa_{op}"] for op in ("paged_attention", "layer_ops", "sampling")}
        assert all(path == runnable_isas()[0] for path in paths.values()), paths
    finally:
        sup.stop()


def test_abort_mid_stream_frees_that_requests_blocks(model_path, tmp_path):
    sup = start(model_path, workers=1, log_dir=tmp_path, pipeline_depth=2)
    try:

        async def run() -> tuple[str, dict]:
            async with AsyncClient(sup.front_endpoint, timeout_s=60) as client:
                stream = client.stream(
                    prompt_token_ids=list(range(3, 90)),
                    max_tokens=400,
                    temperature=0.0,
                    ignore_eos=True,
                    request_id="to-abort",
                )
                seen = 0
                during = None
                async for delta in stream:
                    seen += len(delta.token_ids)
                    if seen >= 3 and during is None:
                        during = blocks(sup)
                        await client.abort("to-abort")
                return stream.result.finish_reason, during

        reason, during = asyncio.run(run())
        assert reason == "abort"
        owners = {o for p in during["pools"] for b in p["blocks"] for o in b["owners"]}
        assert "to-abort" in owners  # it held blocks while it ran
        snap = wait_pool_whole(sup, pools=1)
        assert not any("to-abort" in b["owners"] for p in snap["pools"] for b in p["blocks"])
        assert snap["totals"]["free"] == snap["totals"]["total"] and snap["invariants"]["ok"]
    finally:
        sup.stop()
