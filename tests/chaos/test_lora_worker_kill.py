"""Chaos: a worker dies while loading a LoRA adapter a step needs; nothing is lost, changed or leaked.

worker-0 SIGSTOPs itself (failpoint `worker.lora_load`) after reading an adapter that was loaded at run
time (through the scheduler's admin endpoint) and before caching it; the test SIGKILLs it. Its requests
recompute on worker-1 (and the restarted worker-0), each loading the adapters its requests name from
their NewRequest; every request's greedy tokens equal the in-process engine's with the same adapters,
and every block comes back.
"""

from __future__ import annotations

import httpx
import pytest
from harness.lora_adapters import make_peft_adapter
from harness.stop_failpoint import assert_both_workers_back, stream_killing_worker_0, worker_0_stopping_at

from pagedserve import LLM, SamplingParams

MAX_TOKENS = 40
ADMIN = "chaos-admin"
LORAS = ["a", "b", "b", None, "a", "b", "b", None]  # requests alternate workers: both get "b"


def prompts() -> list[list[int]]:
    return [[(17 * i + 5 * j) % 300 + 3 for j in range(20 + i)] for i in range(len(LORAS))]


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
    with worker_0_stopping_at(
        # The first load is "a" at start; the next is "b", inside a step.
        "worker.lora_load=1*off->1*stop",
        base,
        tmp_path,
        max_loras=2,
        admin_token=ADMIN,
        lora_modules=[f"a={adapters['a']}"],
    ) as sup:
        ops = f"http://127.0.0.1:{sup.config.scheduler_ops_port}"
        loaded = httpx.post(
            f"{ops}/loras/load",
            json={"lora_name": "b", "lora_path": adapters["b"]},
            headers={"authorization": f"Bearer {ADMIN}"},
            timeout=10,
        )
        assert loaded.status_code == 200, loaded.text
        got = stream_killing_worker_0(sup, prompts(), MAX_TOKENS, "lora-chaos", loras=LORAS)
        assert [final for _, final in got] == expected
        assert_both_workers_back(sup)
