"""`pagedserve chaos`: a bounded load while a random worker is SIGKILLed every few seconds.

    pagedserve chaos --start 3                      start 3 workers on the bundled model, 60 s of chaos
    pagedserve chaos                                attach to a running `pagedserve up` (default endpoints)
    pagedserve chaos --endpoint tcp://127.0.0.1:5555 --scheduler-ops http://127.0.0.1:8080 \\
                     --block-manager-ops http://127.0.0.1:8081
    pagedserve chaos --docker                       kill worker containers of `docker compose up`

Every request must end finished or with an error code: one that does neither is lost. When the
load is over the pools must become whole (every pool back, every block free), with no leaked
block and the block manager's invariants holding. For each kill: how long until the scheduler
noticed, and until the restarted worker and its pool were back. Exit 0 only if all of that holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pagedserve.ops.chaos.deployment import Deployment, DeploymentError, attached, started
from pagedserve.ops.chaos.load import LoadSettings, run_load
from pagedserve.ops.chaos.report import build_report, print_report
from pagedserve.ops.chaos.watch import DeploymentWatch, blocks, ready_workers, workers_lost
from pagedserve.ops.deploy.supervisor import DeploymentFailed
from rich.console import Console

MIN_READY_TO_KILL = 2  # never kill the last ready worker: requests would wait, not recompute


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="pagedserve chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = ap.add_argument_group("deployment (default: attach to a running one)")
    where.add_argument("--start", type=int, metavar="N", default=None, help="start N workers of our own")
    where.add_argument(
        "--model", default="smollm2-135m", help="with --start: checkpoint folder or 'smollm2-135m'"
    )
    where.add_argument("--threads", type=int, default=1, help="with --start: torch threads per worker")
    where.add_argument("--num-blocks", type=int, default=None, help="with --start: KV blocks per worker")
    where.add_argument("--ready-timeout", type=float, default=600.0, help="with --start: seconds to come up")
    where.add_argument("--endpoint", default=None, help="scheduler front endpoint (default: config)")
    where.add_argument("--scheduler-ops", default=None, help="scheduler ops URL (default: config)")
    where.add_argument("--block-manager-ops", default=None, help="block manager ops URL (default: config)")
    where.add_argument("--docker", action="store_true", help="kill worker containers of a compose project")
    where.add_argument("--compose-project", default="pagedserve", help="with --docker (default: pagedserve)")
    load = ap.add_argument_group("load and kills")
    load.add_argument("--duration", type=float, default=60.0, help="seconds of load (default: 60)")
    load.add_argument("--concurrency", type=int, default=16, help="requests in flight (default: 16)")
    load.add_argument("--kill-every", type=float, default=5.0, help="seconds between kills (default: 5)")
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
    ap.add_argument("--out", type=Path, default=Path("bench/results/chaos.json"), help="the JSON report")
    args = ap.parse_args(argv)
    if args.start is not None and (args.docker or args.endpoint):
        ap.error("--start runs its own deployment: it takes no --docker or --endpoint")
    if args.start is not None and args.start < MIN_READY_TO_KILL:
        ap.error(f"--start needs at least {MIN_READY_TO_KILL} workers: the last ready one is never killed")
    try:
        lo, hi = (int(x) for x in args.prompt_words.split(","))
    except ValueError:
        ap.error(f"--prompt-words takes MIN,MAX; got {args.prompt_words!r}")
    if not 1 <= lo <= hi:
        ap.error(f"--prompt-words needs 1 <= MIN <= MAX; got {args.prompt_words!r}")
    args.prompt_words = (lo, hi)
    return args


def kill_loop(
    dep: Deployment,
    watch: DeploymentWatch,
    every_s: float,
    until: float,
    rng: random.Random,
    console: Console,
    t0: float,
) -> int:
    """Kill a random ready worker every `every_s` until `until`; returns how many kills were skipped."""
    skipped = 0
    next_kill = t0 + every_s
    while next_kill < until:
        time.sleep(max(next_kill - time.monotonic(), 0.0))
        next_kill += every_s
        ready = watch.ready()
        busy = {k.victim for k in watch.open_kills()}  # killed and not back yet
        choices = [v for v in dep.target.victims() if v.worker_id in ready and v.name not in busy]
        if len(ready) < MIN_READY_TO_KILL or not choices:
            skipped += 1
            console.print(f"[dim]{time.monotonic() - t0:6.1f} s  no kill: {len(ready)} ready worker(s)[/]")
            continue
        victim = rng.choice(choices)
        lost = (workers_lost(dep.scheduler_ops) or 0.0) if victim.worker_id is None else 0.0
        killed_at = time.monotonic()
        try:
            dep.target.kill(victim)
        except (ProcessLookupError, OSError) as e:  # it died on its own meanwhile
            skipped += 1
            console.print(f"[yellow]{killed_at - t0:6.1f} s  could not kill {victim.name}: {e}[/]")
            continue
        watch.record(victim, killed_at, len(ready), lost)
        console.print(f"{killed_at - t0:6.1f} s  SIGKILL {victim.name} (pid {victim.pid})")
    return skipped


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
    settings = LoadSettings(
        dep.front_endpoint,
        args.duration,
        args.concurrency,
        *args.prompt_words,
        args.max_tokens,
        args.drain_timeout,
        args.seed,
    )
    console.print(
        f"chaos: {args.duration:.0f} s of load ({args.concurrency} in flight) against "
        f"{dep.workers} workers, a SIGKILL every {args.kill_every:g} s"
    )
    watch = DeploymentWatch(dep.scheduler_ops, dep.block_manager_ops).start()
    t0 = time.monotonic()
    skipped: list[int] = []
    killer = threading.Thread(
        target=lambda: skipped.append(
            kill_loop(dep, watch, args.kill_every, t0 + args.duration, random.Random(args.seed), console, t0)
        ),
        name="chaos-kills",
        daemon=True,
    )
    killer.start()
    load = asyncio.run(run_load(settings))
    killer.join()
    console.print(
        f"{time.monotonic() - t0:6.1f} s  load over: {load.finished} finished, "
        f"{sum(load.errored.values())} errored, {load.lost} lost; waiting for whole pools"
    )
    settle_start = time.monotonic()
    watch.wait_whole(args.settle_timeout)
    dump, whole, _ = settle(dep, max(args.settle_timeout - (time.monotonic() - settle_start), 1.0))
    watch.stop()
    keys = ("duration", "concurrency", "kill_every", "max_tokens", "drain_timeout", "settle_timeout", "seed")
    settings_json = {k: getattr(args, k) for k in keys} | {"prompt_words": list(args.prompt_words)}
    return build_report(
        settings_json,
        dep.to_json(),
        load,
        watch.kills,
        skipped[0] if skipped else 0,
        t0,
        dump,
        whole,
        time.monotonic() - settle_start,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pagedserve.shared.log import configure_logging

    configure_logging("chaos", "json", "error")  # the supervisor's restart lines would bury the report
    # Off a terminal (a log, CI) rich would assume 80 columns and cut container names short.
    console = Console(width=None if sys.stdout.isatty() else 120)
    try:
        if args.start is not None:
            console.print(f"starting block manager, scheduler and {args.start} workers ({args.model})")
            deployment = started(args.start, args.model, args.threads, args.num_blocks, args.ready_timeout)
        else:
            project = args.compose_project if args.docker else None
            deployment = attached(args.endpoint, args.scheduler_ops, args.block_manager_ops, project)
        with deployment as dep:
            report = run(dep, args, console)
    except (DeploymentError, DeploymentFailed, TimeoutError) as e:
        print(f"pagedserve chaos: {e}", file=sys.stderr)
        return 2
    print_report(report, console)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"JSON: {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
