"""Chaos: a worker dies while loading a LoRA adapter a step needs; nothing is lost, changed or leaked.

worker-0 SIGSTOPs itself (failpoint `worker.lora_load`) after reading an adapter that was loaded at run
time (through the scheduler's admin endpoint) and before caching it; the test SIGKILLs it. Its requests
recompute on worker-1 (and the restarted worker-0), each loading the adapters its requests name from
their NewRequest; every request's greedy tokens equal the in-process engine's with the same adapters,
and every block comes back.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest
from harness.deployment import assert_no_leak, start, stream_greedy, wait_for, workers_ready
from harness.lora_adapters import make_peft_adapter

from pagedserve import LLM, SamplingParams

MAX_TOKENS = 40
ADMIN = "chaos-admin"
LORAS = ["a", "b", "b", None, "a", "b", "b", None]  # requests alternate workers: both get "b"


def prompts() -> list[list[int]]:
    return [[(17 * i + 5 * j) % 300 + 3 for j in range(20 + i)] for i in range(len(LORAS))]


def stopped(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "T"
    except OSError:
        return False


@pytest.fixture(scope="module")
def setup(tiny_model, tmp_path_factory):
    base = tiny_model("llama")
    root = tmp_path_factory.mktemp("lora-chaos")
    return base, {n: str(make_peft_adapter(base, root / n, seed=i, rank=4)) for i, n in enumerate("ab")}


def test_worker_killed_while_loading_an_adapter_loses_nothing_and_leaks_no_block(setup, tmp_path):
    base, adapters = setup
    llm = LLM(str(base), num_blocks=256, max_loras=2, lora_modules=adapters)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [o.token_ids for o in llm.generate(prompts(), greedy, lora=LORAS)]
    sup = start(
        base,
        workers=2,
        log_dir=tmp_path,
        max_loras=2,
        admin_token=ADMIN,
        lora_modules=[f"a={adapters['a']}"],
        # The first load is "a" at start; the next is "b", inside a step.
        failpoints={"worker-0": "worker.lora_load=1*off->1*stop"},
    )
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        ops = f"http://127.0.0.1:{sup.config.scheduler_ops_port}"
        loaded = httpx.post(
            f"{ops}/loras/load",
            json={"lora_name": "b", "lora_path": adapters["b"]},
            headers={"authorization": f"Bearer {ADMIN}"},
            timeout=10,
        )
        assert loaded.status_code == 200, loaded.text
        killed: dict[str, int] = {}

        async def kill_when_stopped(seen: int) -> None:
            if not killed and stopped(sup.group.pid("worker-0")):
                killed["pid"] = sup.kill_worker(0, signal.SIGKILL)

        async def watch() -> list[tuple[list[int], list[int]]]:
            async def poll() -> None:
                while not killed:
                    await kill_when_stopped(0)
                    await asyncio.sleep(0.05)

            watcher = asyncio.create_task(poll())
            try:
                return await stream_greedy(
                    sup.front_endpoint,
                    prompts(),
                    MAX_TOKENS,
                    "lora-chaos",
                    kill_when_stopped,
                    loras=LORAS,
                    timeout_s=120,
                    heartbeat_s=0.3,
                    reconnect_after_s=1.5,
                )
            finally:
                watcher.cancel()

        got = asyncio.run(watch())
        assert killed, "worker-0 never stopped loading an adapter: the failpoint did not fire"
        assert [final for _, final in got] == expected
        assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
        assert_no_leak(sup, 2)
    finally:
        sup.kill_worker(0, signal.SIGCONT)
        sup.stop()
