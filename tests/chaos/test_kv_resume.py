"""Chaos: a worker SIGKILLed with its KV pool in shared memory comes back and resumes its requests.

Real processes: the worker kills itself at a failpoint (mid-K/V-write, mid-prefill, after a step before
its result), only in its first process; its restart maps the same segment, the block manager keeps
the tables, the scheduler resumes every running request from its committed slots. Outputs must equal
the fault-free greedy run, no committed prefill token is computed again (the scheduler's counter), no
block leaks, and the segment is gone once the deployment stops. Also: the block manager killed while
the segment lives, a segment of another layout, a second process with a held name.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time

import pytest
from harness.deployment import blocks, get_text, start, stream_greedy, wait_for, workers_ready
from harness.greedy_reference import greedy_outputs, random_prompts

from pagedserve.ops.deploy.json_logs import log_events
from pagedserve.ops.deploy.supervisor import Supervisor, config_env
from pagedserve.services.worker.kv_segment import HEADER_BYTES, KVSegment

MAX_TOKENS = 40
SHORT = random_prompts(12, seed=5, max_len=40)
LONG = random_prompts(6, seed=6, max_len=200)  # several prefill chunks each at 48 tokens a step


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


@pytest.fixture(scope="module")
def expected(model_path) -> dict[str, list[list[int]]]:
    return {
        "short": greedy_outputs(model_path, SHORT, MAX_TOKENS),
        "long": greedy_outputs(model_path, LONG, MAX_TOKENS),
    }


def run_load(sup: Supervisor, prompts: list[list[int]], prefix: str, on_progress=None) -> list[list[int]]:
    async def progress(seen: int) -> None:
        if on_progress is not None:
            on_progress(seen)

    got = asyncio.run(
        stream_greedy(
            sup.front_endpoint,
            prompts,
            MAX_TOKENS,
            prefix,
            progress,
            timeout_s=120,
            heartbeat_s=0.3,
            reconnect_after_s=1.5,
        )
    )
    return [streamed for streamed, _ in got]


def counter(sup: Supervisor, name: str) -> float:
    text = get_text(f"{sup.scheduler_ops_url}/metrics")
    match = re.search(rf"^{name}_total (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def assert_whole(sup: Supervisor) -> None:
    def settled():
        snap = blocks(sup)
        return snap if all(p["totals"]["free"] == p["totals"]["total"] for p in snap["pools"]) else None

    snap = wait_for(settled, 15) or blocks(sup)
    assert snap["totals"]["leaked"] == 0 and snap["invariants"]["ok"], snap["totals"]
    assert all(p["totals"]["free"] == p["totals"]["total"] for p in snap["pools"]), snap["totals"]


@pytest.mark.parametrize(
    ("spec", "prompts", "overrides"),
    [
        ("worker.kv_write=100*off->1*kill", "short", {}),  # layer 2 of 3 of a decode step
        ("worker.prefill_kv_write=7*off->1*kill", "long", {"max_num_batched_tokens": 48}),  # a later chunk
        ("worker.delay_reply=25*off->1*kill", "short", {}),  # the step is computed, its result never sent
    ],
    ids=["mid-kv-write", "mid-prefill", "after-step-before-result"],
)
def test_a_worker_killed_mid_step_resumes_every_request_with_nothing_recomputed(
    model_path, expected, tmp_path, spec, prompts, overrides
):
    sup = start(
        model_path,
        workers=1,
        log_dir=tmp_path,
        failpoints={"worker-0": spec},
        rearm_failpoints=False,
        **overrides,
    )
    try:
        got = run_load(sup, SHORT if prompts == "short" else LONG, prompts)
        assert sup.restarts("worker-0") == 1, "the failpoint did not kill the worker: the load is too short"
        assert got == expected[prompts]
        # The counters follow the core's stats on the service's next tick: wait for it.
        assert wait_for(lambda: counter(sup, "pagedserve_requests_resumed") > 0, 5)
        assert counter(sup, "pagedserve_prefill_recomputed_tokens") == 0
        assert log_events(tmp_path / "block-manager.log", "pool_continued")
        assert_whole(sup)
        folder = sup.segments.path if sup.segments else None
        assert folder is not None and [p.name for p in folder.iterdir()] == ["worker-0.kv"]
    finally:
        sup.stop()
    assert not folder.exists()  # removed with the deployment


def test_the_block_manager_killed_while_the_segment_lives_then_a_worker_kill_still_resumes(
    model_path, expected, tmp_path
):
    sup = start(model_path, workers=1, log_dir=tmp_path)
    try:
        worker_pid = sup.pid("worker-0")
        hit: dict[str, int] = {}

        def kill_block_manager(seen: int) -> None:
            if seen >= 120 and "bm" not in hit:
                hit["bm"] = sup.kill("block-manager")

        got = run_load(sup, SHORT, "bm", kill_block_manager)
        assert "bm" in hit and got == expected["short"]  # every table was lost: they recomputed, exactly
        assert sup.pid("worker-0") == worker_pid  # the worker and its segment lived through it
        assert wait_for(lambda: workers_ready(sup), 30)

        def kill_worker(seen: int) -> None:
            if seen >= 150 and "worker" not in hit:
                hit["worker"] = sup.kill_worker(0)

        resumed_before = counter(sup, "pagedserve_requests_resumed")
        # The first phase may recompute (on a loaded machine the block manager's loss can cost the
        # worker its lease too); what this phase adds is what the claim is about.
        recomputed_before = counter(sup, "pagedserve_prefill_recomputed_tokens")
        got = run_load(sup, SHORT, "after", kill_worker)
        assert "worker" in hit and got == expected["short"]
        # The new block manager registered the living segment's pool: the restart continues it.
        # The counters follow the core's stats on the service's next tick: wait for it.
        assert wait_for(lambda: counter(sup, "pagedserve_requests_resumed") > resumed_before, 5)
        assert counter(sup, "pagedserve_prefill_recomputed_tokens") == recomputed_before
        assert_whole(sup)
    finally:
        sup.stop()


def test_a_segment_of_another_layout_is_discarded_and_the_worker_serves(model_path, expected, tmp_path):
    segments = tmp_path / "segments"
    segments.mkdir()
    stale = KVSegment.open(
        segments,
        "worker-0",
        {"format": 1, "model": "/another/model", "num_blocks": 4},
        4,
        lambda n: n * 4096,
        False,
    )
    stale.memory[HEADER_BYTES : 2 * HEADER_BYTES] = b"\xff" * HEADER_BYTES  # where the new K/V would start
    stale.close()
    sup = start(model_path, workers=1, log_dir=tmp_path / "logs", kv_segment_dir=str(segments))
    try:
        assert run_load(sup, SHORT, "layout") == expected["short"]
        (discarded,) = log_events(tmp_path / "logs" / "worker-0.log", "kv_segment_discarded")
        assert "'/another/model' != " in discarded["reason"]
    finally:
        sup.stop()


def test_a_second_live_worker_with_a_held_name_is_refused_with_the_holders_pid(model_path, tmp_path):
    sup = start(model_path, workers=1, log_dir=tmp_path)
    try:
        holder = sup.pid("worker-0")
        started = time.monotonic()
        duplicate = subprocess.run(
            [sys.executable, "-m", "pagedserve.ops.cli", "worker", "--worker-id", "worker-0"],
            env=config_env(sup.config) | {"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert duplicate.returncode == 78, duplicate.stderr[-2000:]
        assert f"worker name 'worker-0' is held by a live process (pid {holder})" in duplicate.stderr
        assert time.monotonic() - started < 60  # refused before loading a model, not after a timeout
        assert sup.pid("worker-0") == holder and workers_ready(sup) == ["worker-0"]  # untouched
    finally:
        sup.stop()
