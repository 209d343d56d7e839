"""`pagedserve bench fleet`: how many workers one scheduler + block manager keep busy, by simulation.

    pagedserve bench fleet                           fleets of 1, 2, 4, 8, 16, 32 simulated workers
    pagedserve bench fleet --sizes 1,2 --measure 4   a quick look
    pagedserve bench fleet --shards 4 --sizes 16,64 --step-ms 40
                                                     the workers split over 4 scheduler shards
                                                     behind `pagedserve router`

Each worker runs no model (`pagedserve worker --simulate-step-ms 10`: a step sleeps 10 ms and
returns fake tokens), so what is measured is the control plane. Per fleet size, a real deployment
(block manager, scheduler, N workers as processes) gets `--per-worker` requests in flight per
worker (token-id prompts, EOS ignored, not streamed), and over `--measure` seconds after a warm-up:

- worker idle: the share of worker time spent waiting between steps (the scheduler's
  pagedserve_worker_idle/busy_seconds, reported by the workers themselves);
- steps/s, and output tokens/s, over the whole fleet;
- scheduler CPU per step (user + system time of its process from /proc);
- block-manager time per batched RPC (its process's CPU time per batch applied: the service time
  behind each of the scheduler's round trips, without the socket latency).

The largest fleet kept under 5% idle is what one scheduler can drive at this step time on this
machine. A 10 ms step is a fast GPU decode step; a slower model's step makes the fleet larger.

With `--shards S` each fleet is split evenly over S shards (each its own scheduler and block manager)
behind the router, and the load goes through the router: the figures are summed over the shards, and
two more are reported: the router's CPU per request, and steps per second of scheduler CPU (which
stays flat from 1 shard to S when the shards scale).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedserve.ops.deploy.process_group import RestartPolicy
from pagedserve.ops.deploy.shards import ROUTER, ShardedDeployment
from pagedserve.ops.deploy.supervisor import Supervisor
from pagedserve.ops.results import save_report
from pagedserve.shared.config import ServeConfig, add_config_flag

IDLE_TARGET = 0.05
VOCAB_SIZE = 32000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="pagedserve bench fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--sizes", default="1,2,4,8,16,32", help="fleet sizes (default: 1,2,4,8,16,32)")
    ap.add_argument("--step-ms", type=float, default=10.0, help="simulated step time (default: 10)")
    ap.add_argument("--per-worker", type=int, default=16, help="requests in flight per worker (default: 16)")
    ap.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (default: 128)")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring (default: 2)")
    ap.add_argument("--measure", type=float, default=8.0, help="seconds measured per size (default: 8)")
    ap.add_argument(
        "--shards", type=int, default=1, help="scheduler shards behind a router (default: 1, none)"
    )
    add_config_flag(ap, "pipeline_depth", 2)
    ap.add_argument("--ready-timeout", type=float, default=180.0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/fleet.json"))
    args = ap.parse_args(argv)
    try:
        args.sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--sizes takes a comma list of integers; got {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 1:
        ap.error(f"--sizes must be positive; got {args.sizes}")
    if args.shards < 1 or any(size % args.shards for size in args.sizes):
        ap.error(f"--shards must be >= 1 and divide every size; got {args.shards} for {args.sizes}")
    return args


# ---------------------------------------------------------------- what is read from the processes


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prometheus_values(text: str) -> dict[str, float]:
    """`name{labels}` -> value for every sample line of a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric_sum(values: dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


@dataclass(slots=True)
class Reading:
    at: float
    metrics: dict[str, float]
    bm: dict[str, float]
    scheduler_cpu: float
    bm_cpu: float
    router_cpu: float


def _summed(into: dict[str, float], values: dict[str, float]) -> None:
    for key, value in values.items():
        into[key] = into.get(key, 0.0) + value


def read(deployment: Supervisor | ShardedDeployment) -> Reading:
    """Metrics and CPU times, summed over the shards (one, without a router)."""
    from pagedserve.ops.deploy import ops_client

    reading = Reading(time.monotonic(), {}, {}, 0.0, 0.0, 0.0)
    sharded = isinstance(deployment, ShardedDeployment)
    for sup in deployment.shards if sharded else [deployment]:
        assert isinstance(sup, Supervisor), "the fleet runs its shards as local processes"
        _, sched = ops_client.get(f"{sup.scheduler_ops_url}/metrics", timeout_s=5.0)
        _, bm = ops_client.get(f"{sup.block_manager_ops_url}/metrics", timeout_s=5.0)
        sched_pid, bm_pid = sup.pid("scheduler"), sup.pid("block-manager")
        assert sched_pid is not None and bm_pid is not None, "a core service died during the benchmark"
        _summed(reading.metrics, prometheus_values(sched.decode()))
        _summed(reading.bm, prometheus_values(bm.decode()))
        reading.scheduler_cpu += cpu_seconds(sched_pid)
        reading.bm_cpu += cpu_seconds(bm_pid)
    if sharded:
        assert deployment.group is not None
        router_pid = deployment.group.pid(ROUTER)
        assert router_pid is not None, "the router died during the benchmark"
        reading.router_cpu = cpu_seconds(router_pid)
    return reading


def summarise(size: int, a: Reading, b: Reading) -> dict[str, Any]:
    def delta(name: str, src: str = "metrics") -> float:
        return metric_sum(getattr(b, src), name) - metric_sum(getattr(a, src), name)

    wall = b.at - a.at
    steps = delta("pagedserve_step_seconds_count")
    idle = delta("pagedserve_worker_idle_seconds_total")
    busy = delta("pagedserve_worker_busy_seconds_total")
    batches = delta("pagedserve_bm_batches_total", "bm")
    requests = delta("pagedserve_requests_finished_total")
    scheduler_cpu = b.scheduler_cpu - a.scheduler_cpu
    return {
        "workers": size,
        "seconds": round(wall, 2),
        "steps": int(steps),
        "steps_per_s": round(steps / wall, 1),
        "steps_per_s_per_worker": round(steps / wall / size, 1),
        "output_tokens_per_s": round(delta('pagedserve_tokens_total{kind="generated"}') / wall, 1),
        "worker_idle": round(idle / (idle + busy), 4) if idle + busy else None,
        "scheduler_cpu_per_step_ms": round(1000 * (b.scheduler_cpu - a.scheduler_cpu) / steps, 3)
        if steps
        else None,
        "scheduler_cpu_share": round((b.scheduler_cpu - a.scheduler_cpu) / wall, 3),
        "bm_batches": int(batches),
        "bm_cpu_per_batch_ms": round(1000 * (b.bm_cpu - a.bm_cpu) / batches, 3) if batches else None,
        "requests_per_s": round(requests / wall, 1),
        "steps_per_scheduler_cpu_s": round(steps / scheduler_cpu, 1) if scheduler_cpu else None,
        "router_cpu_per_request_ms": round(1000 * (b.router_cpu - a.router_cpu) / requests, 3)
        if requests
        else None,
        "router_cpu_share": round((b.router_cpu - a.router_cpu) / wall, 3),
    }


# ---------------------------------------------------------------- one fleet


def simulated_model(folder: Path) -> Path:
    """A checkpoint folder with a config.json only: the scheduler needs limits, not weights."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"vocab_size": VOCAB_SIZE, "max_position_embeddings": 4096, "eos_token_id": 2}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def fleet_config(model: Path, args: argparse.Namespace) -> ServeConfig:
    from pagedserve.ops.deploy.local_api import local_config

    return local_config(
        str(model),
        simulate_step_ms=args.step_ms,
        num_blocks=4096,
        pipeline_depth=args.pipeline_depth,
        max_inflight_per_client=100_000,
        log_level="warning",
    )


async def keep_busy(endpoint: str, in_flight: int, max_tokens: int, until: float) -> int:
    """`in_flight` lanes of one request after another until `until`; returns requests finished."""
    from pagedserve.shared.sdk import AsyncClient

    rng = random.Random(0)
    run = uuid.uuid4().hex[:6]
    done = 0
    async with AsyncClient(endpoint, timeout_s=120.0) as client:

        async def lane(i: int) -> None:
            nonlocal done
            n = 0
            while time.monotonic() < until:
                prompt = [rng.randrange(3, VOCAB_SIZE) for _ in range(rng.randint(16, 64))]
                await client.generate(
                    prompt_token_ids=prompt,
                    request_id=f"fleet-{run}-{i}-{n}",
                    max_tokens=max_tokens,
                    ignore_eos=True,
                )
                done += 1
                n += 1

        await asyncio.gather(*(lane(i) for i in range(in_flight)))
    return done


def wait_workers(sup: Supervisor, size: int, timeout_s: float) -> None:
    from pagedserve.ops.chaos.deployment import wait_for_workers

    ready = wait_for_workers(sup.scheduler_ops_url, size, timeout_s)
    if len(ready) < size:
        raise TimeoutError(f"only {len(ready)} of {size} simulated workers ready after {timeout_s:.0f} s")


def start_fleet(config: ServeConfig, size: int, shards: int, log_dir: Path) -> Supervisor | ShardedDeployment:
    if shards == 1:
        policy = RestartPolicy(max_restarts_per_minute=0)  # a death here is a bug to see, not to hide
        return Supervisor(config, workers=size, log_dir=log_dir, policy=policy)
    return ShardedDeployment(config, shards, size // shards, log_dir=log_dir)


def run_fleet(size: int, model: Path, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    config = fleet_config(model, args)
    with start_fleet(config, size, args.shards, log_dir / f"fleet-{size}") as sup:
        sup.wait_ready(timeout_s=args.ready_timeout)
        for shard in sup.shards if isinstance(sup, ShardedDeployment) else [sup]:
            assert isinstance(shard, Supervisor)
            wait_workers(shard, size // args.shards, args.ready_timeout)
        start = time.monotonic()
        until = start + args.warmup + args.measure
        readings: list[Reading] = []

        async def measured() -> int:
            load = asyncio.create_task(
                keep_busy(config.front_endpoint, size * args.per_worker, args.max_tokens, until)
            )
            await asyncio.sleep(args.warmup)
            readings.append(await asyncio.to_thread(read, sup))
            await asyncio.sleep(max(until - time.monotonic(), 0.0))
            readings.append(await asyncio.to_thread(read, sup))
            return await load

        finished = asyncio.run(measured())
        row = summarise(size, readings[0], readings[1])
        row["shards"] = args.shards
        row["requests_finished"] = finished
        return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pagedserve.shared.log import configure_logging

    configure_logging("bench-fleet", "json", "error")
    work = Path(tempfile.mkdtemp(prefix="pagedserve-fleet-"))
    model = simulated_model(work / "model")
    rows = []
    for size in args.sizes:
        row = run_fleet(size, model, args, work)
        rows.append(row)
        print(
            f"{size:3d} workers: idle {row['worker_idle']:.1%}, {row['steps_per_s']:.0f} steps/s, "
            f"scheduler {row['scheduler_cpu_per_step_ms']} ms CPU/step ({row['scheduler_cpu_share']:.0%} of a core), "
            f"block manager {row['bm_cpu_per_batch_ms']} ms CPU/batch"
            + (
                f", router {row['router_cpu_per_request_ms']} ms CPU/request, "
                f"{row['steps_per_scheduler_cpu_s']} steps per scheduler CPU-second"
                if args.shards > 1
                else ""
            ),
            flush=True,
        )
    under = [r["workers"] for r in rows if r["worker_idle"] is not None and r["worker_idle"] < IDLE_TARGET]
    report = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"machine_cpus": os.cpu_count()},
        "fleets": rows,
        "idle_target": IDLE_TARGET,
        "largest_fleet_under_idle_target": max(under) if under else None,
    }
    print(f"largest fleet under {IDLE_TARGET:.0%} idle: {report['largest_fleet_under_idle_target']}")
    return save_report(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
