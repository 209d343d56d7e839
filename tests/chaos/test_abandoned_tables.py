"""Chaos: a block table whose KV was never computed must never serve a prefix-cache hit.

The block manager keys a full block for the prefix cache when its slots are given, before the
worker has written them. If the table's owner then vanishes (a scheduler SIGKILLed between the
block-manager RPC and the step, or one that timed out on the block manager and moved to a new
lease owner), the table stays until its lease lapses, keyed over KV nobody wrote. The ten-minute
chaos run found this: re-submitted requests hit such blocks and gave wrong tokens.

Here a "ghost scheduler" (a bare socket speaking the block-manager protocol) allocates a prompt on
the worker's pool and is never heard from again; the real scheduler then serves the same prompt.
"""

from __future__ import annotations

import time

import pytest
from harness.deployment import blocks, start
from harness.ghost_owner import ghost_allocate
from harness.greedy_reference import greedy_outputs, random_prompts

from pagedserve import Client

MAX_TOKENS = 24
TTL = 2.0


@pytest.fixture(scope="module")
def model_path(tiny_model):
    return tiny_model("llama")


def test_tables_of_a_vanished_owner_serve_no_prefix_hits(model_path, tmp_path):
    prompts = [p + p[:40] for p in random_prompts(4, seed=11, max_len=40)]  # >= 2 full blocks each
    expected = greedy_outputs(model_path, prompts, MAX_TOKENS)
    sup = start(
        model_path,
        workers=1,
        log_dir=tmp_path,
        lease_ttl_s=TTL,
        lease_renew_interval_s=0.5,
        reap_interval_s=0.25,
    )
    try:
        ghost_blocks = ghost_allocate(
            sup.config.block_manager_endpoint, "worker-0", prompts, "ghost-scheduler:0"
        )
        assert all(len(b) >= 2 for b in ghost_blocks)
        with Client(sup.front_endpoint, timeout_s=60) as client:
            got = [
                client.generate(prompt_token_ids=p, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
                for p in prompts
            ]
            assert [r.token_ids for r in got] == expected
            assert [r.usage.cached_tokens for r in got] == [0] * len(prompts)

            # Once the ghost's leases lapse its keys leave the cache: the same prompts again,
            # now computed by the real scheduler, are hits and still exact.
            deadline = time.monotonic() + TTL + 5
            while any(lease["owner"] == "ghost-scheduler:0" for lease in blocks(sup)["leases"]):
                assert time.monotonic() < deadline, "the ghost's leases were never reaped"
                time.sleep(0.1)
            again = [
                client.generate(prompt_token_ids=p, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
                for p in prompts
            ]
            assert [r.token_ids for r in again] == expected
            assert all(r.usage.cached_tokens > 0 for r in again)
        snap = blocks(sup)
        assert snap["totals"]["leaked"] == 0 and snap["invariants"]["ok"], snap["invariants"]
    finally:
        sup.stop()
