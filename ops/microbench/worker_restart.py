"""Benchmark: how long a SIGKILLed worker takes to serve again, and where a restart spends it.

    python -m pagedserve.ops.microbench.worker_restart [--model smollm2-135m] [--kills 8]
        [--standby 0|1] [--out bench/results/worker-restart.json]

A deployment of two workers (one thread each) on the model, with the supervisor's chaos restart policy
(0.25 s backoff) and its KV segments. A stream of greedy requests runs throughout, so each kill
interrupts running requests. Each kill hits worker-0; the time to serve again is from the SIGKILL to
the scheduler's `worker_resumed` / `worker_joined` line for it. From the restarted worker's start log:
- `process_s`: the interpreter and imports before the service began;
- `load_s`: the model;
- `pool_s`: the segment mapped;
- `register_s`: the block manager's answer.
A promoted standby did the first two before the kill. Also the run's resumed requests and recomputed
prefill tokens (0 when every pool continued).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from pagedserve.ops.chaos.deployment import CHAOS_RESTARTS
from pagedserve.ops.chaos.watch import metric_values
from pagedserve.ops.deploy.json_logs import log_events
from pagedserve.ops.deploy.local_api import local_config
from pagedserve.ops.deploy.supervisor import Supervisor, resolve_model_first
from pagedserve.ops.results import write_json
from pagedserve.shared.config import add_config_flag


def load_forever(endpoint: str, stop: threading.Event) -> None:
    from pagedserve import AsyncClient

    async def lane(client: AsyncClient, seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            prompt = [rng.randrange(100, 20000) for _ in range(rng.randrange(40, 200))]
            try:
                await client.generate(prompt_token_ids=prompt, max_tokens=64, temperature=0.0)
            except Exception:  # a lane lives through the kills; errors are the chaos run's business
                await asyncio.sleep(0.2)

    async def run() -> None:
        async with AsyncClient(endpoint, timeout_s=120) as client:
            await asyncio.gather(*(lane(client, i) for i in range(4)))

    asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(ap, "model")
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--every", type=float, default=6.0, help="seconds between kills")
    ap.add_argument("--standby", type=int, choices=(0, 1), default=1)
    ap.add_argument("--out", type=Path, default=Path("bench/results/worker-restart.json"))
    args = ap.parse_args(argv)
    config = resolve_model_first(local_config(args.model, num_threads=1, standby_workers=args.standby))
    logs = Path(tempfile.mkdtemp(prefix="worker-restart-"))
    sup = Supervisor(config, workers=2, log_dir=logs, policy=CHAOS_RESTARTS)
    stop = threading.Event()
    kills: list[float] = []
    with sup:
        sup.wait_ready(timeout_s=600)
        time.sleep(5.0)  # the standby loads after the workers
        load = threading.Thread(target=load_forever, args=(sup.front_endpoint, stop), daemon=True)
        load.start()
        time.sleep(args.every)
        for _ in range(args.kills):
            sup.kill_worker(0)
            kills.append(time.time())
            time.sleep(args.every)
        stop.set()
        load.join(timeout=60)
        counters = metric_values(
            sup.scheduler_ops_url,
            ("pagedserve_requests_resumed_total", "pagedserve_prefill_recomputed_tokens_total"),
        )
    back = sorted(
        datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
        for event in ("worker_resumed", "worker_joined")
        for e in log_events(logs / "scheduler.log", event)
        if e.get("worker_id") == "worker-0"
    )
    serve_again = []
    for at in kills:
        later = [t for t in back if t > at]
        serve_again.append(round(later[0] - at, 3) if later else None)
    starts = [e for e in log_events(logs / "worker-0.log", "worker_started")][1:]  # the restarts
    phases = {
        k: [s["startup"].get(k) for s in starts] for k in ("process_s", "load_s", "pool_s", "register_s")
    }
    measured = [s for s in serve_again if s is not None]
    result = {
        "bench": "worker_restart",
        "model": args.model,
        "standby": args.standby,
        "kills": len(kills),
        "serve_again_s": serve_again,
        "serve_again_median_s": round(statistics.median(measured), 3) if measured else None,
        "serve_again_max_s": max(measured) if measured else None,
        "startup_phases_s": phases,
        "resumed_requests": None if counters is None else counters["pagedserve_requests_resumed_total"],
        "recomputed_prefill_tokens": None
        if counters is None
        else counters["pagedserve_prefill_recomputed_tokens_total"],
        "logs": str(logs),
    }
    write_json(args.out, result, echo=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
