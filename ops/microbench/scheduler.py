"""Micro-benchmark: the cost of one `schedule()` with many waiting and running requests.

    python -m pagedserve.ops.microbench.scheduler [--waiting 10000] [--running 256] [--out bench/results/scheduler.json]

Target: under 1 ms per schedule() with 10,000 waiting and 256 running (the waiting queue's length
must not matter: only heads of priority levels are looked at).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from pagedserve.ops.results import write_json
from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.services.scheduler.scheduler import Scheduler, SchedulerLimits
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import StepResult

W = "w0"


def build(waiting: int, running: int, block_size: int = 16) -> tuple[Scheduler, BlockManager]:
    bm = BlockManager(lease_ttl_s=1e9)
    num_blocks = running * 64 + 1024
    bm.add_pool(W, num_blocks, block_size)
    sched = Scheduler(
        SchedulerLimits(
            max_num_seqs=running, max_num_batched_tokens=1 << 16, pipeline_depth=1, max_model_len=1 << 16
        ),
        eos_token_ids=[0],
    )
    sched.add_worker(W, num_blocks, block_size)
    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    for i in range(running):
        sched.add_request(f"run-{i}", list(range(1, 129)), params, 0.0)
    # Admit and prefill the running ones, answer with one token each: they are decoding now.
    plan = sched.schedule(W, 0.0)
    ex = sched.commit(plan, bm.apply(plan.block_ops, 0.0), 0.0)
    ids = ex.request_ids()
    sched.on_step_result(W, StepResult(ex.step, ids, [5] * len(ids)), 0.0)
    for i in range(waiting):
        sched.add_request(f"wait-{i}", list(range(1, 65)), params.model_copy(update={"priority": i % 4}), 1.0)
    return sched, bm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--waiting", type=int, default=10_000)
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--out", default="bench/results/scheduler.json")
    args = ap.parse_args()
    sched, bm = build(args.waiting, args.running)
    plan_ms, step_ms = [], []
    for _ in range(args.iterations):
        t0 = time.perf_counter()
        plan = sched.schedule(W, 2.0)
        t1 = time.perf_counter()
        ex = sched.commit(plan, bm.apply(plan.block_ops, 2.0), 2.0)
        t2 = time.perf_counter()
        assert ex is not None and len(ex.cached_requests) == args.running and not ex.new_requests
        ids = ex.request_ids()
        sched.on_step_result(W, StepResult(ex.step, ids, [5] * len(ids)), 2.0)
        plan_ms.append((t1 - t0) * 1e3)
        step_ms.append((t2 - t0) * 1e3)
    result = {
        "waiting": args.waiting,
        "running": args.running,
        "schedule_ms_median": statistics.median(plan_ms),
        "schedule_ms_p99": float(np.percentile(plan_ms, 99)),
        "schedule_apply_commit_ms_median": statistics.median(step_ms),
        "target_ms": 1.0,
    }
    print(
        f"schedule() with {args.waiting} waiting, {args.running} running: "
        f"median {result['schedule_ms_median']:.3f} ms, p99 {result['schedule_ms_p99']:.3f} ms (target < 1 ms)"
    )
    print(
        f"schedule + block-manager apply + commit: median {result['schedule_apply_commit_ms_median']:.3f} ms"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(args.out), result)


if __name__ == "__main__":
    main()
