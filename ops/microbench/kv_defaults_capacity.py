"""Benchmark: what a deployment with the default pool holds, from its start log and under load.

    python -m pagedserve.ops.microbench.kv_defaults_capacity [--model smollm2-135m] [--requests 64]
        [--prompt-tokens 1024] [--max-tokens 16] [--out bench/results/kv-defaults-capacity.json]

`pagedserve serve`'s defaults (one worker, kv_cache_memory auto, max_num_seqs 64), on loopback ports.
The worker's `worker_started` line gives the pool it chose (tokens, blocks, bytes per token, the
memory reading). Then `--requests` requests of `--prompt-tokens` random tokens are sent at once, and
the scheduler's /metrics is read every 0.1 s: the most requests running at once, and the preemptions
(a request thrown out of the pool for want of blocks) over the run. The pool holds them all when
every request ran at once and nothing was preempted.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pagedserve.ops.chaos.watch import metric_values
from pagedserve.ops.deploy.json_logs import log_events
from pagedserve.ops.deploy.local_api import local_config
from pagedserve.ops.deploy.supervisor import Supervisor, resolve_model_first
from pagedserve.ops.results import write_json
from pagedserve.shared.config import add_config_flag

WATCHED = ("pagedserve_requests_running", "pagedserve_requests_waiting", "pagedserve_preemptions_total")


def send_all(endpoint: str, requests: int, prompt_tokens: int, max_tokens: int) -> list[str]:
    from pagedserve import AsyncClient

    rng = random.Random(0)
    prompts = [[rng.randrange(100, 20000) for _ in range(prompt_tokens)] for _ in range(requests)]

    async def run() -> list[str]:
        async with AsyncClient(endpoint, timeout_s=1800) as client:
            outs = await asyncio.gather(
                *(
                    client.generate(prompt_token_ids=p, max_tokens=max_tokens, temperature=0.0)
                    for p in prompts
                )
            )
        return [o.finish_reason for o in outs]

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(ap, "model")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("bench/results/kv-defaults-capacity.json"))
    args = ap.parse_args(argv)
    config = resolve_model_first(local_config(args.model))
    logs = Path(tempfile.mkdtemp(prefix="kv-defaults-"))
    samples: list[dict[str, float]] = []
    stop = threading.Event()
    with Supervisor(config, workers=1, log_dir=logs) as sup:
        sup.wait_ready(timeout_s=600)

        def watch() -> None:
            while not stop.is_set():
                values = metric_values(sup.scheduler_ops_url, WATCHED)
                if values is not None:
                    samples.append(values)
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.monotonic()
        reasons = send_all(sup.front_endpoint, args.requests, args.prompt_tokens, args.max_tokens)
        elapsed = time.monotonic() - started
        stop.set()
        watcher.join()
        final = metric_values(sup.scheduler_ops_url, WATCHED) or {}
    start = log_events(logs / "worker-0.log", "worker_started")[0]
    pool = {k: v for k, v in start.items() if k.startswith(("kv_", "memory_"))}
    result: dict[str, Any] = {
        "bench": "kv_defaults_capacity",
        "model": args.model,
        "requests": args.requests,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "pool": pool,
        "finish_reasons": sorted(set(reasons)),
        "max_running": max((s["pagedserve_requests_running"] for s in samples), default=None),
        "preemptions": final.get("pagedserve_preemptions_total"),
        "elapsed_s": round(elapsed, 1),
        "logs": str(logs),
    }
    write_json(args.out, result, echo=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
