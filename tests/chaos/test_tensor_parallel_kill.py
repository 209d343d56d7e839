"""Chaos: a tensor-parallel worker (two gloo ranks) loses one rank; the group is restarted whole,
nothing is lost or changed, and no block leaks.

Rank 1 SIGSTOPs itself before a decode step's forward (failpoint `worker.rank_forward`), while rank 0
already waits in that step's first all-reduce; the test SIGKILLs it. Rank 0's collective fails at
once, it exits, the supervisor restarts worker-0, which starts a new rank 1; the requests recompute
and finish with the in-process engine's greedy tokens. A SIGKILLed rank 0 takes its rank 1 with it
(the parent-death signal): no orphan holds the old group's memory.
"""

from __future__ import annotations

import signal

from harness.deployment import assert_no_leak, start, wait_for, workers_ready
from harness.stop_failpoint import rank_pid, stream_killing_worker_0, worker_0_stopping_at

from pagedserve import LLM, SamplingParams

MAX_TOKENS = 32
TP = {"tensor_parallel_size": 2, "num_blocks": 64}


def prompts() -> list[list[int]]:
    return [[(11 * i + 3 * j) % 250 + 3 for j in range(12 + 4 * i)] for i in range(4)]


def one_worker_back(sup) -> None:
    assert wait_for(lambda: len(workers_ready(sup)) == 1, 60)
    assert_no_leak(sup, 1)


def test_rank_killed_mid_step_restarts_the_group_and_loses_nothing(tiny_model, tmp_path):
    model = tiny_model("llama")
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [o.token_ids for o in LLM(str(model), num_blocks=64).generate(prompts(), greedy)]
    # The 6th forward: the prompts are in, the requests decoding.
    spec = "worker.rank_forward=5*off->1*stop"
    with worker_0_stopping_at(spec, model, tmp_path, workers=1, rearm_failpoints=False, **TP) as sup:
        first_group = sup.pid("worker-0")
        got = stream_killing_worker_0(sup, prompts(), MAX_TOKENS, "tp-chaos", rank=1)
        assert [final for _, final in got] == expected
        one_worker_back(sup)
        assert sup.pid("worker-0") != first_group, "rank 0 must have exited with its rank 1"
        assert rank_pid(sup.pid("worker-0"), 1) is not None


def test_rank_0_killed_takes_its_other_ranks_with_it(tiny_model, tmp_path):
    sup = start(tiny_model("llama"), workers=1, log_dir=tmp_path, **TP)
    try:
        assert wait_for(lambda: workers_ready(sup), 30)
        rank_1 = rank_pid(sup.pid("worker-0"), 1)
        assert rank_1 is not None
        sup.kill_worker(0, signal.SIGKILL)
        assert wait_for(lambda: not alive(rank_1), 10), f"rank 1 (pid {rank_1}) outlived its rank 0"
        one_worker_back(sup)
    finally:
        sup.stop()


def alive(pid: int) -> bool:
    """Running, or stopped: anything but gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
