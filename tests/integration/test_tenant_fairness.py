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
    # alice-0 runs and alice-1 had its turn before bob arrived in the turns; then it is bob's.
    assert finished.index("bob-0") <= 2, finished
    assert [r for r in finished if r.startswith("alice")] == [f"alice-{i}" for i in range(ALICE_REQUESTS)]


async def finish_order(endpoint: str) -> list[str]:
    finished: list[str] = []
    async with AsyncClient(endpoint, timeout_s=120) as client:

        async def one(rid: str, user: str) -> None:
            await client.generate(
                prompt_token_ids=[5, 6, 7, 8],
                request_id=rid,
                user=user,
                max_tokens=256,
                temperature=0.0,
                ignore_eos=True,
            )
            finished.append(rid)

        alice = [asyncio.create_task(one(f"alice-{i}", "alice")) for i in range(ALICE_REQUESTS)]
        await asyncio.sleep(0.2)  # all of alice's are queued before bob's arrives
        await asyncio.gather(one("bob-0", "bob"), *alice)
    return finished
