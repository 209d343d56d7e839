"""Chaos: a worker dies in the middle of verifying proposed tokens; nothing is lost, changed or leaked.

worker-0 SIGSTOPs itself (failpoint `worker.mid_verification`) after the forward that wrote the KV of
proposed tokens and before any of them is judged; the test then SIGKILLs it. Its requests recompute on
worker-1 from their accepted tokens, the blocks its steps held (lookahead slots included) come back, and
the greedy output is the one without speculation or faults.
"""

from __future__ import annotations

import json
import random

import pytest
from harness.greedy_reference import greedy_outputs
from harness.stop_failpoint import assert_both_workers_back, stream_killing_worker_0, worker_0_stopping_at

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
    with worker_0_stopping_at(
        "worker.mid_verification=3*off->1*stop",
        model_path,
        tmp_path,
        speculative_config=spec,
        # The lost worker's requests recompute on worker-1: the path this test is about. (With pools
        # kept, they would resume on the restarted worker-0, whose failpoint is armed again;
        # tests/chaos/test_kv_resume.py covers speculating requests resuming.)
        kv_persist=False,
    ) as sup:
        got = stream_killing_worker_0(sup, prompts(), MAX_TOKENS, "spec-chaos")
        assert [streamed for streamed, _ in got] == expected
        assert_both_workers_back(sup)
