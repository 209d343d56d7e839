"""Micro-benchmark of the block-manager core (pure Python, one process, no sockets).

    python -m pagedserve.ops.microbench.block_manager [--requests 10000] [--out bench/results/block_manager.json]

Times are the process's CPU time, so other load on a shared machine does not distort the rates.

1. decode lifecycle: allocate a short prompt, grow token by token up to --max-tokens, free;
   --concurrency requests live at once, the way a running batch grows one token per step.
   Headline: block allocations + frees per second (target >= 200,000/s).
2. reaping --requests expired leases at once: leases/s.
3. the prefix-cache hit path: allocations whose prompt shares a long cached prefix: allocations/s.
4. the batched RPC: one `apply` of a decode step's grow ops: ops/s.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

from pagedserve.ops.results import write_json
from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.shared.config import add_config_flag
from pagedserve.shared.protocol.blocks import Grow, OpError

TARGET_BLOCK_OPS_PER_S = 200_000


def bench_decode_lifecycle(
    num_requests: int, max_tokens: int, prompt_len: int, block_size: int, concurrency: int
) -> dict[str, Any]:
    blocks_per_request = -(-max_tokens // block_size)
    manager = BlockManager()
    num_blocks = concurrency * blocks_per_request
    manager.add_pool("w0", num_blocks, block_size)
    allocate, grow, free = manager.allocate, manager.grow, manager.free
    calls = block_allocs = block_frees = 0
    now = 0.0
    next_token = (7,)
    t0 = time.process_time()
    # Waves of `concurrency` requests: each step grows every live request by one token.
    for wave_start in range(0, num_requests, concurrency):
        ids = [f"r{i}" for i in range(wave_start, min(wave_start + concurrency, num_requests))]
        for i, rid in enumerate(ids):
            # A distinct first token per request: this measures fresh blocks, not cache hits.
            if allocate("w0", rid, "bench", [wave_start + i, *range(1, prompt_len)], prompt_len, now) is None:
                raise RuntimeError("the pool is sized for every wave: an allocation cannot fail")
        for _ in range(prompt_len, max_tokens):
            now += 0.01
            for rid in ids:
                grow(rid, 1, next_token, now)
        # Every block the wave holds was allocated by it (the pool was all free, nothing is shared).
        block_allocs += num_blocks - manager.num_free_blocks("w0")
        for rid in ids:
            block_frees += free(rid)
        calls += len(ids) * (2 + max_tokens - prompt_len)
    elapsed = time.process_time() - t0
    problems = manager.check_invariants()
    assert not problems, problems
    assert manager.num_free_blocks("w0") == num_blocks and block_allocs == block_frees
    block_ops = block_allocs + block_frees
    return {
        "requests": num_requests,
        "max_tokens": max_tokens,
        "prompt_tokens": prompt_len,
        "block_size": block_size,
        "concurrency": concurrency,
        "cpu_seconds": elapsed,
        "calls": calls,
        "calls_per_s": calls / elapsed,
        "block_allocs": block_allocs,
        "block_frees": block_frees,
        "block_ops_per_s": block_ops / elapsed,
        "target_block_ops_per_s": TARGET_BLOCK_OPS_PER_S,
        "meets_target": block_ops / elapsed >= TARGET_BLOCK_OPS_PER_S,
    }


def bench_reap(num_leases: int, block_size: int) -> dict[str, Any]:
    manager = BlockManager(lease_ttl_s=10.0)
    manager.add_pool("w0", num_leases * 2, block_size)
    for i in range(num_leases):
        manager.allocate(
            "w0", f"r{i}", "crashed-scheduler", [i, *range(1, block_size + 4)], block_size + 4, 0.0
        )
    t0 = time.process_time()
    reclaimed = manager.reap_expired(11.0)
    elapsed = time.process_time() - t0
    assert len(reclaimed) == num_leases and manager.num_free_blocks("w0") == num_leases * 2
    return {"leases": num_leases, "cpu_seconds": elapsed, "leases_per_s": num_leases / elapsed}


def bench_prefix_hits(num_allocs: int, prefix_len: int, suffix_len: int, block_size: int) -> dict[str, Any]:
    manager = BlockManager()
    manager.add_pool("w0", 4 * (prefix_len + suffix_len) // block_size + 64, block_size)
    prefix = list(range(prefix_len))
    assert manager.allocate("w0", "system-prompt", "bench", prefix, prefix_len, 0.0) is not None
    hit_tokens = 0
    t0 = time.process_time()
    for i in range(num_allocs):
        rid = f"r{i}"
        allocation = manager.allocate("w0", rid, "bench", prefix + [i] * suffix_len, suffix_len, 0.0)
        hit_tokens += allocation.num_cached_tokens
        manager.free(rid)
    elapsed = time.process_time() - t0
    assert hit_tokens == num_allocs * prefix_len
    return {
        "allocations": num_allocs,
        "prefix_tokens": prefix_len,
        "block_size": block_size,
        "cpu_seconds": elapsed,
        "allocations_per_s": num_allocs / elapsed,
        "hit_blocks_per_s": num_allocs * prefix_len / block_size / elapsed,
    }


def bench_apply(batch_size: int, num_steps: int, block_size: int) -> dict[str, Any]:
    manager = BlockManager()
    manager.add_pool("w0", batch_size * (num_steps // block_size + 2), block_size)
    for i in range(batch_size):
        manager.allocate("w0", f"r{i}", "bench", [i, 1, 2], 3, 0.0)
    ids = [f"r{i}" for i in range(batch_size)]
    t0 = time.process_time()
    for step in range(num_steps):
        reply = manager.apply([Grow(rid, 1, [step]) for rid in ids], float(step))
    elapsed = time.process_time() - t0
    assert not any(type(r) is OpError for r in reply.results)
    return {
        "ops_per_batch": batch_size,
        "batches": num_steps,
        "cpu_seconds": elapsed,
        "ops_per_s": batch_size * num_steps / elapsed,
        "batches_per_s": num_steps / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--max-tokens", type=int, default=1_000)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    add_config_flag(parser, "block_size", 16)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--out", default="bench/results/block_manager.json")
    args = parser.parse_args()

    lifecycle = bench_decode_lifecycle(
        args.requests, args.max_tokens, args.prompt_tokens, args.block_size, args.concurrency
    )
    reap = bench_reap(args.requests, args.block_size)
    hits = bench_prefix_hits(args.requests, 1024, 16, args.block_size)
    batch = bench_apply(256, 200, args.block_size)

    rows = [
        ("decode lifecycle: block allocs + frees", lifecycle["block_ops_per_s"], "blocks/s"),
        ("decode lifecycle: calls (alloc/grow/free)", lifecycle["calls_per_s"], "ops/s"),
        ("reap expired leases", reap["leases_per_s"], "leases/s"),
        (f"prefix-cache hit ({hits['prefix_tokens']}-token prefix)", hits["allocations_per_s"], "allocs/s"),
        (f"apply() batch of {batch['ops_per_batch']} grow ops", batch["ops_per_s"], "ops/s"),
    ]
    print(
        f"block manager micro-benchmark (Python {platform.python_version()}, {platform.machine()}, "
        f"rates per CPU second, load average {os.getloadavg()[0]:.1f})"
    )
    for name, value, unit in rows:
        print(f"  {name:<46} {value:>14,.0f} {unit}")
    verdict = "meets" if lifecycle["meets_target"] else "MISSES"
    print(f"  {verdict} the target of {TARGET_BLOCK_OPS_PER_S:,} block allocs + frees per second")

    result = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],  # other load slows even CPU time (shared caches, SMT)
        "decode_lifecycle": lifecycle,
        "reap": reap,
        "prefix_hits": hits,
        "apply_batch": batch,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
