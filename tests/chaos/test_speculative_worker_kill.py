"""Chaos: a worker dies in the middle of verifying proposed tokens; nothing is lost, changed or leaked.

worker-0 SIGSTOPs itself (failpoint `worker.mid_verification`) after the forward that wrote the KV of
proposed tokens and before any of them is judged; the test then SIGKILLs it. Its requests recompute on
worker-1 from their accepted tokens, the blocks its steps held (lookahead slots included) come back, and
the greedy output is the one without speculation or faults.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
from pathlib import Path

import pytest
from harness.deployment import assert_no_leak, start, stream_greedy, wait_for, workers_ready
from harness.greedy_reference import greedy_outputs

MAX_TOKENS = 60
SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "max_step_rows": 64, "row_cost": 0.0}'


def prompts() -> list[list[int]]:
    # Every token id of the tiny vocabulary (3..319) in each prompt, shuffled: with 1-grams, prompt
    # lookup finds any last token in the prompt, so every decode proposes.
    out = []
    for i in range(8):
        tokens = list(range(3, 320))
        random.Random(i).shuffle(tokens)
        out.append(tokens)
    return out


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


def stopped(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "T"
    except OSError:
        return False


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_worker_killed_mid_verification_loses_nothing_and_leaks_no_block(model_path, tmp_path, method):
    # draft_model: the target as its own draft (a checkpoint with its vocabulary), on the worker's own
    # draft pool, which dies with the worker; its requests start new draft sequences on worker-1.
    spec = (
        SPEC
        if method == "ngram"
        else json.dumps({**json.loads(SPEC), "method": method, "model": str(model_path)})
    )
    expected = greedy_outputs(model_path, prompts(), MAX_TOKENS)
    sup = start(
        model_path,
        workers=2,
        log_dir=tmp_path,
        speculative_config=spec,
        failpoints={"worker-0": "worker.mid_verification=3*off->1*stop"},
        # The lost worker's requests recompute on worker-1: the path this test is about. (With pools
        # kept, they would resume on the restarted worker-0, whose failpoint is armed again;
        # tests/chaos/test_kv_resume.py covers speculating requests resuming.)
        kv_persist=False,
    )
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        killed: dict[str, int] = {}

        async def kill_when_stopped(seen: int) -> None:
            if not killed and stopped(sup.group.pid("worker-0")):
                killed["pid"] = sup.kill_worker(0, signal.SIGKILL)

        got = asyncio.run(
            stream_greedy(
                sup.front_endpoint,
                prompts(),
                MAX_TOKENS,
                "spec-chaos",
                kill_when_stopped,
                timeout_s=120,
                heartbeat_s=0.3,
                reconnect_after_s=1.5,
            )
        )
        assert killed, "worker-0 never stopped mid-verification: the failpoint did not fire"
        assert [streamed for streamed, _ in got] == expected
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        assert_no_leak(sup, 2)
    finally:
        sup.kill_worker(0, signal.SIGCONT)
        sup.stop()
