"""Benchmark: decode at a long context with float32 KV against int8 and bfloat16 KV, on the runner alone.

    python -m pagedserve.ops.microbench.kv_int8_decode [--model smollm2-135m] [--context 4096]
        [--batches 1 4] [--steps 32] [--kv float32 int8 bfloat16] [--threads N]
        [--out bench/results/kv-int8-decode.json]

For each KV dtype and batch: B requests of `context` random prompt tokens, prefilled in chunks of
2,048, then `steps` greedy decode steps timed one by one (median and mean ms per step; tokens/s =
B / median step). At a long context a decode step reads every K/V row of every request: float32 KV
reads 46 KB per token of SmolLM2 per step, bfloat16 23 KB, int8 12 KB; the step is bound by that read.

Every row runs the model in float32 and changes the KV alone: float32, int8 or bfloat16 (half
float32's bytes, widened as the kernel reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.runner import ModelRunner
from pagedserve.shared.config import add_config_flag
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.protocol.step import CachedRequest, Execute, NewRequest, WorkerSampling

BLOCK = 16
# KV choice -> (the model's dtype, kv_cache_dtype)
KV_RUNS = {"float32": ("float32", "auto"), "int8": ("float32", "int8"), "bfloat16": ("float32", "bfloat16")}
CHUNK = 2048
GREEDY = WorkerSampling.of(SamplingParams(temperature=0.0), None)


def decode_ms(runner: ModelRunner, batch: int, context: int, steps: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    per = -(-(context + steps + 1) // BLOCK)
    step = 0
    for b in range(batch):
        prompt = [rng.randrange(100, runner.vocab_size - 100) for _ in range(context)]
        table = list(range(b * per, (b + 1) * per))
        done = 0
        while done < context:  # chunked prefill, one request at a time
            n = min(CHUNK, context - done)
            if done == 0:
                ex = Execute(step, new_requests=[NewRequest(f"r{b}", prompt, context, 0, n, table, GREEDY)])
            else:
                ex = Execute(step, cached_requests=[CachedRequest(f"r{b}", n)])
            runner.execute(ex)
            step += 1
            done += n
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        runner.execute(Execute(step, cached_requests=[CachedRequest(f"r{b}", 1) for b in range(batch)]))
        times.append((time.perf_counter() - start) * 1e3)
        step += 1
    runner.requests.clear()
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(ap, "model")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--kv", nargs="+", choices=sorted(KV_RUNS), default=["float32", "int8"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results/kv-int8-decode.json"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    blocks = max(args.batches) * -(-(args.context + args.steps + 1) // BLOCK)
    rows = []
    for kv in args.kv:
        dtype, kv_cache_dtype = KV_RUNS[kv]
        runner = ModelRunner(
            path, dtype=dtype, block_size=BLOCK, num_blocks=blocks, kv_cache_dtype=kv_cache_dtype
        )
        for batch in args.batches:
            decode_ms(runner, batch, 256, 4)  # warm-up: kernels loaded, buffers sized
            times = decode_ms(runner, batch, args.context, args.steps)
            median = statistics.median(times)
            rows.append(
                {
                    "kv_cache_dtype": kv,
                    "model_dtype": dtype,
                    "batch": batch,
                    "context": args.context,
                    "median_ms": round(median, 2),
                    "mean_ms": round(statistics.fmean(times), 2),
                    "tokens_per_s": round(batch * 1e3 / median, 1),
                    "bytes_per_token": runner.pool_sizing.bytes_per_token,
                    "weights": runner.runtime["weights"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        del runner
    median = {(r["kv_cache_dtype"], r["batch"]): r["median_ms"] for r in rows}
    # Each KV choice's speed against float32 KV's (> 1: faster), per batch.
    speedups = {
        kv: {str(b): round(median["float32", b] / median[kv, b], 2) for b in args.batches}
        for kv in args.kv
        if kv != "float32" and "float32" in args.kv
    }
    result = {
        "bench": "kv_int8_decode",
        "model": args.model,
        "cpu": _cpu_name(),
        "threads": torch.get_num_threads(),
        "rows": rows,
        "speedup_over_float32_by_batch": speedups,
    }
    print(json.dumps({"speedup_over_float32_by_batch": speedups, "cpu": result["cpu"]}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cpus)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    raise SystemExit(main())
