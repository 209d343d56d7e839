"""Per-user fairness through real processes: with one request running at a time, a user who queued
many requests first does not hold back another user's single request (the waiting queue takes
tenants in turn); under first-come-first-served bob's request would finish last."""

from __future__ import annotations

import asyncio

from harness.deployment import start

from pagedserve import AsyncClient

ALICE_REQUESTS = 8


def test_one_users_backlog_does_not_starve_another_user(tiny_model, tmp_path):
    sup = start(tiny_model("llama"), workers=1, log_dir=tmp_path, max_num_seqs=1)
    try:
        finished = asyncio.run(finish_order(sup.front_endpoint))
    finally:
        sup.stop()
    assert sorted(finished) == sorted([f"alice-{i}" for i in range(ALICE_REQUESTS)] + ["bob-0"])
    # bob arrives while alice-0 runs: he is next (1); under first-come-first-served he is last (8).
    # 2 allows one more of alice's to have been admitted already when his request landed.
    assert finished.index("bob-0") <= 2, finished
    assert [r for r in finished if r.startswith("alice")] == [f"alice-{i}" for i in range(ALICE_REQUESTS)]


async def finish_order(endpoint: str) -> list[str]:
    finished: list[str] = []
    alice_started = asyncio.Event()
    async with AsyncClient(endpoint, timeout_s=120) as client:

        async def one(rid: str, user: str) -> None:
            stream = client.stream(
                prompt_token_ids=[5, 6, 7, 8],
                request_id=rid,
                user=user,
                max_tokens=256,
                temperature=0.0,
                ignore_eos=True,
            )
            async for _ in stream:
                alice_started.set()
            finished.append(rid)

        alice = [asyncio.create_task(one(f"alice-{i}", "alice")) for i in range(ALICE_REQUESTS)]
        # alice's first runs (the rest were sent with it, so they queue): only now does bob ask.
        await alice_started.wait()
        await asyncio.gather(one("bob-0", "bob"), *alice)
    return finished
