"""`pagedserve chaos`: a bounded streaming load while faults of every kind hit the deployment at random.

    pagedserve chaos --start 3                      start 3 workers on the bundled model, 60 s of chaos
    pagedserve chaos --start 3 --duration 600 --fault-every 5     the long run (>= 100 faults)
    pagedserve chaos --start 3 --faults worker_kill                only worker kills, as before
    pagedserve chaos                                attach to a running `pagedserve up` (default endpoints)
    pagedserve chaos --endpoint tcp://127.0.0.1:5555 --scheduler-ops http://127.0.0.1:8080 \\
                     --block-manager-ops http://127.0.0.1:8081
    pagedserve chaos --docker                       kill worker containers of `docker compose up`
    pagedserve chaos soak --model PATH              10,000 short requests, memory at 1k and 10k (soak.py)
    pagedserve chaos stress --minutes N             the services' tests in a loop on a loaded machine (stress.py)

Faults (ops/chaos/faults.py): SIGKILL of a worker, SIGSTOP/SIGCONT of a worker for less and for
more than the worker timeout, SIGKILL of the scheduler, of the block manager, and of the API server
when the deployment runs one. Every request must end finished or with an error code (one that does
neither is lost); an error is allowed only while no worker was ready. Each stream's deltas must add
up to its result exactly, and each result must equal a fault-free run of the same prompt through
the same deployment afterwards. When the load is over the pools must become whole (every pool
back, every block free), with no leaked block and the block manager's invariants holding. For each
fault: how long until it was noticed, and until the deployment was whole again. A JSON report and
a PNG timeline beside it; exit 0 only if all of that holds.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from pagedserve.ops.chaos.deployment import Deployment, DeploymentError, attached, started
from pagedserve.ops.chaos.faults import FAULT_KINDS, MIN_READY_TO_HIT, FaultInjector
from pagedserve.ops.chaos.load import LoadOutcome, LoadSettings, run_load, run_reference
from pagedserve.ops.chaos.outputs import judge_outputs
from pagedserve.ops.chaos.report import add_segments_left, build_report, print_report
from pagedserve.ops.chaos.timeline import write_timeline
from pagedserve.ops.chaos.watch import DeploymentWatch, blocks, ready_workers, scheduler_requests
from pagedserve.ops.deploy.supervisor import DeploymentFailed
from pagedserve.ops.results import write_json
from pagedserve.shared.config import add_config_flag


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="pagedserve chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = ap.add_argument_group("deployment (default: attach to a running one)")
    where.add_argument("--start", type=int, metavar="N", default=None, help="start N workers of our own")
    add_config_flag(where, "model", help="with --start: checkpoint folder or 'smollm2-135m'")
    where.add_argument("--threads", type=int, default=1, help="with --start: torch threads per worker")
    add_config_flag(where, "num_blocks", help="with --start: KV blocks per worker")
    where.add_argument("--ready-timeout", type=float, default=600.0, help="with --start: seconds to come up")
    where.add_argument(
        "--api",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --start: run the OpenAI-compatible API server too, as `pagedserve up` does (default: on)",
    )
    add_config_flag(
        where,
        "api_processes",
        1,
        help="with --start: API processes on one port (api_kill hits the first: streams on the others go on)",
    )
    where.add_argument("--endpoint", default=None, help="scheduler front endpoint (default: config)")
    where.add_argument("--scheduler-ops", default=None, help="scheduler ops URL (default: config)")
    where.add_argument("--block-manager-ops", default=None, help="block manager ops URL (default: config)")
    where.add_argument("--docker", action="store_true", help="hit worker containers of a compose project")
    where.add_argument("--compose-project", default="pagedserve", help="with --docker (default: pagedserve)")
    load = ap.add_argument_group("load and faults")
    load.add_argument("--duration", type=float, default=60.0, help="seconds of load (default: 60)")
    load.add_argument("--concurrency", type=int, default=16, help="requests in flight (default: 16)")
    load.add_argument(
        "--fault-every",
        "--kill-every",
        dest="fault_every",
        type=float,
        default=5.0,
        help="seconds between faults (default: 5)",
    )
    load.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help=f"comma-separated kinds to draw from (default: all: {','.join(FAULT_KINDS)})",
    )
    load.add_argument(
        "--reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="afterwards, run every prompt again without faults and compare outputs (default: on)",
    )
    load.add_argument(
        "--api-lanes",
        type=int,
        default=None,
        help="how many of the concurrent lanes go through the OpenAI HTTP API, streaming "
        "(default: a quarter, when the deployment runs the API)",
    )
    load.add_argument("--max-tokens", type=int, default=48, help="output tokens per request (default: 48)")
    load.add_argument("--prompt-words", default="4,48", help="min,max words per prompt (default: 4,48)")
    load.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        help="after the load: seconds a request may still take before it counts as lost",
    )
    load.add_argument(
        "--settle-timeout",
        type=float,
        default=60.0,
        help="after the load: seconds for the pools to become whole",
    )
    load.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results/chaos.json"),
        help="the JSON report; the PNG timeline goes beside it (default: bench/results/chaos.json)",
    )
    args = ap.parse_args(argv)
    args.faults = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = sorted(set(args.faults) - set(FAULT_KINDS))
    if unknown or not args.faults:
        ap.error(f"--faults takes kinds among {','.join(FAULT_KINDS)}; got {unknown or 'none'}")
    if args.start is not None and (args.docker or args.endpoint):
        ap.error("--start runs its own deployment: it takes no --docker or --endpoint")
    if args.start is not None and args.start < MIN_READY_TO_HIT:
        ap.error(f"--start needs at least {MIN_READY_TO_HIT} workers: the last ready one is never hit")
    try:
        lo, hi = (int(x) for x in args.prompt_words.split(","))
    except ValueError:
        ap.error(f"--prompt-words takes MIN,MAX; got {args.prompt_words!r}")
    if not 1 <= lo <= hi:
        ap.error(f"--prompt-words needs 1 <= MIN <= MAX; got {args.prompt_words!r}")
    args.prompt_words = (lo, hi)
    return args


def settle(dep: Deployment, timeout_s: float) -> tuple[dict[str, Any] | None, bool, float]:
    """Wait until every worker is ready and every pool is registered and entirely free."""
    started_at = time.monotonic()
    while True:
        dump = blocks(dep.block_manager_ops)
        ready = ready_workers(dep.scheduler_ops) or []
        pools = [] if dump is None else dump["pools"]
        whole = (
            len(ready) >= dep.workers
            and len(pools) >= dep.workers
            and all(p["totals"]["free"] == p["totals"]["total"] for p in pools)
        )
        elapsed = time.monotonic() - started_at
        if whole or elapsed >= timeout_s:
            return dump, whole, elapsed
        time.sleep(0.25)


def run(dep: Deployment, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    api_url = None if dep.api_health is None else dep.api_health.removesuffix("/health") + "/v1"
    api_lanes = 0 if api_url is None else args.concurrency // 4 if args.api_lanes is None else args.api_lanes
    settings = LoadSettings(
        dep.front_endpoint,
        args.duration,
        args.concurrency,
        *args.prompt_words,
        args.max_tokens,
        args.drain_timeout,
        args.seed,
        api_url,
        min(api_lanes, args.concurrency),
        scheduler_view=lambda: scheduler_requests(dep.scheduler_ops),
    )
    console.print(
        f"chaos: {args.duration:.0f} s of load ({args.concurrency} in flight) against "
        f"{dep.workers} workers, a fault every {args.fault_every:g} s among {', '.join(args.faults)}"
        + (f"; {settings.api_lanes} lanes through the HTTP API" if settings.api_lanes else "")
    )
    load_state = LoadOutcome()
    watch = DeploymentWatch(
        dep.scheduler_ops,
        dep.block_manager_ops,
        dep.workers,
        dep.api_health,
        in_flight=lambda: len(load_state.live),
        restarts=dep.restarts if dep.supervisor is not None else None,
        service_pids=dep.target.services,
    ).start()
    injector = FaultInjector(
        dep.target,
        watch,
        args.faults,
        args.fault_every,
        dep.worker_timeout_s,
        random.Random(args.seed),
        console.print,
    )
    t0 = time.monotonic()
    faults = threading.Thread(
        target=injector.run, args=(t0, t0 + args.duration), name="chaos-faults", daemon=True
    )
    faults.start()
    try:
        load = asyncio.run(run_load(settings, load_state))
    finally:
        faults.join(timeout=30)
        injector.resume_all()
    console.print(
        f"{time.monotonic() - t0:6.1f} s  load over: {load.finished} finished, "
        f"{sum(load.errored.values())} errored, {load.lost} lost; waiting for whole pools"
    )
    settle_start = time.monotonic()
    watch.wait_recovered(args.settle_timeout)
    dump, whole, _ = settle(dep, max(args.settle_timeout - (time.monotonic() - settle_start), 1.0))
    settle_s = time.monotonic() - settle_start
    watch.stop()
    kv = kv_counters(watch)  # before the reference run, which must not move them
    reference = None
    if args.reference and load.records:
        console.print(f"reference: {len(load.records)} prompts again, without faults")
        prompts = [r.prompt for r in load.records]
        reference = asyncio.run(run_reference(dep.front_endpoint, prompts, args.concurrency, args.max_tokens))
    outputs = judge_outputs(load.records, reference, watch.timeline.samples)
    keys = (
        "duration",
        "concurrency",
        "fault_every",
        "faults",
        "max_tokens",
        "drain_timeout",
        "settle_timeout",
    )
    settings_json = {k: getattr(args, k) for k in (*keys, "seed")} | {
        "prompt_words": list(args.prompt_words),
        "api_lanes": settings.api_lanes,
    }
    report = build_report(
        settings_json,
        dep.to_json(),
        load,
        watch.faults,
        injector.skipped,
        t0,
        dump,
        whole,
        settle_s,
        outputs,
        watch.timeline.to_json(t0),
        injector.unavailable,
        kv,
    )
    report["watch_errors"] = watch.errors[:20]
    return report


def kv_counters(watch: DeploymentWatch) -> dict[str, float]:
    totals = watch.read_kv_totals()
    return {
        "resumed_requests": totals["pagedserve_requests_resumed_total"],
        "recomputed_prefill_tokens": totals["pagedserve_prefill_recomputed_tokens_total"],
    }


def main(argv: list[str] | None = None) -> int:
    if argv and argv[0] == "soak":  # `pagedserve chaos soak`: the slow-leak run, its own flags
        from pagedserve.ops.chaos.soak import main as soak_main

        return soak_main(argv[1:])
    if argv and argv[0] == "stress":  # `pagedserve chaos stress`: the hang-hunting loop, its own flags
        from pagedserve.ops.chaos.stress import main as stress_main

        return stress_main(argv[1:])
    args = parse_args(argv)
    from pagedserve.shared.log import configure_logging

    configure_logging("chaos", "json", "error")  # the supervisor's restart lines would bury the report
    # Off a terminal (a log, CI) rich would assume 80 columns and cut container names short.
    console = Console(width=None if sys.stdout.isatty() else 120)
    try:
        if args.start is not None:
            console.print(f"starting block manager, scheduler and {args.start} workers ({args.model})")
            deployment = started(
                args.start,
                args.model,
                args.threads,
                args.num_blocks,
                args.ready_timeout,
                args.api,
                args.api_processes,
            )
        else:
            project = args.compose_project if args.docker else None
            deployment = attached(args.endpoint, args.scheduler_ops, args.block_manager_ops, project)
        with deployment as dep:
            report = run(dep, args, console)
            folder = dep.supervisor.segments.path if dep.supervisor and dep.supervisor.segments else None
    except (DeploymentError, DeploymentFailed, TimeoutError) as e:
        print(f"pagedserve chaos: {e}", file=sys.stderr)
        return 2
    # The deployment has stopped: none of its KV segments may be left in shared memory.
    add_segments_left(
        report, None if folder is None else len(list(folder.glob("*"))) if folder.exists() else 0
    )
    print_report(report, console)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    console.print(f"JSON: {args.out}")
    if args.out.suffix == ".json":
        console.print(f"timeline: {write_timeline(report, args.out.with_suffix('.png'))}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
