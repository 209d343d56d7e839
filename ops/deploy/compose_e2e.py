"""The host side of ops/compose_e2e.sh: what it checks against the containers, one subcommand each.

    python -m pagedserve.ops.deploy.compose_e2e debian-mirror bookworm
    python -m pagedserve.ops.deploy.compose_e2e free-ports 5
    python -m pagedserve.ops.deploy.compose_e2e wait-ready --scheduler-ops URL --workers 2
    python -m pagedserve.ops.deploy.compose_e2e generate --endpoint tcp://127.0.0.1:PORT
    python -m pagedserve.ops.deploy.compose_e2e kill-under-load --project P --endpoint E --scheduler-ops URL --block-manager-ops URL

Needs only the client side of pagedserve (the SDK, rich, the Docker SDK for Python): no torch.
Each subcommand exits 0 when its check holds, and says why not otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "Three primary colours are",
    "A haiku about the sea:",
]


def debian_mirror(suite: str) -> int:
    """Print the mirror this host's apt uses for `suite` (debootstrap's third argument)."""
    from pagedserve.ops.deploy.apt_sources import mirror_for, source_files

    try:
        print(mirror_for(suite, source_files()))
    except LookupError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


def free_ports(n: int) -> int:
    from pagedserve.ops.deploy.local_api import free_ports as pick

    print(" ".join(str(p) for p in pick(n)))
    return 0


def wait_ready(scheduler_ops: str, workers: int, timeout_s: float) -> int:
    from pagedserve.ops.chaos.watch import ready_workers

    deadline = time.monotonic() + timeout_s
    last: list[str] | None = None
    while time.monotonic() < deadline:
        ready = ready_workers(scheduler_ops)
        if ready != last:
            print(f"    /readyz workers: {ready}", flush=True)
            last = ready
        if ready is not None and len(ready) >= workers:
            return _kernels_compiled(scheduler_ops)
        time.sleep(1.0)
    print(f"only {last} ready after {timeout_s:.0f} s", file=sys.stderr)
    return 1


def _kernels_compiled(scheduler_ops: str) -> int:
    """Every worker container runs each C++ op on a CPU ISA path, not the torch fallback (the image
    carries a compiler and builds them once into the cache volume)."""
    from pagedserve.ops.deploy.ops_client import get_json

    fallbacks = []
    for worker in get_json(f"{scheduler_ops}/workers")["workers"]:
        paths = {k: v for k, v in worker["runtime"].items() if k.startswith("isa_")}
        print(f"    {worker['worker_id']}: {paths}, weights {worker['runtime'].get('weights')}", flush=True)
        if not paths or "torch" in paths.values():
            fallbacks.append(worker["worker_id"])
    if fallbacks:
        print(f"workers on the torch fallback: {fallbacks}", file=sys.stderr)
        return 1
    return 0


async def _generate_all(endpoint: str, max_tokens: int) -> list[tuple[str, str, int]]:
    from pagedserve.shared.sdk import AsyncClient

    async with AsyncClient(endpoint, timeout_s=300.0) as client:
        results = await asyncio.gather(
            *(client.generate(p, max_tokens=max_tokens, temperature=0.0) for p in PROMPTS)
        )
    return [(p, r.text, len(r.token_ids)) for p, r in zip(PROMPTS, results, strict=True)]


def generate(endpoint: str, max_tokens: int) -> int:
    """Greedy completions of a few prompts at once, from the host through the SDK."""
    answers = asyncio.run(_generate_all(endpoint, max_tokens))
    for prompt, text, n in answers:
        print(f"    {prompt!r} -> {text.strip()[:70]!r} ({n} tokens)")
    empty = [p for p, _, n in answers if n == 0]
    if empty:
        print(f"no tokens for {empty}", file=sys.stderr)
        return 1
    return 0


def kill_under_load(args: argparse.Namespace) -> int:
    """`pagedserve chaos --docker`, then: nothing errored either, and the engine restarted each
    killed container (its restart count went up)."""
    import docker
    from pagedserve.ops import chaos

    out = Path(args.out)
    code = chaos.main(
        [
            "--docker",
            "--compose-project", args.project,
            "--endpoint", args.endpoint,
            "--scheduler-ops", args.scheduler_ops,
            "--block-manager-ops", args.block_manager_ops,
            "--duration", str(args.duration),
            "--kill-every", str(args.kill_every),
            # This step is about the engine restarting killed containers; pauses (which the chaos
            # run now mixes in by default) are the chaos lanes' to judge, not this one's.
            "--faults", "worker_kill",
            "--concurrency", str(args.concurrency),
            "--max-tokens", str(args.max_tokens),
            "--settle-timeout", str(args.settle_timeout),
            "--out", str(out),
        ]
    )  # fmt: skip
    if code != 0:
        return code
    report = json.loads(out.read_text())
    problems = []
    if report["requests"]["errored_total"]:
        problems.append(f"errored requests: {report['requests']['errored']}")
    kills = [f for f in report["faults"] if f["kind"] == "worker_kill"]
    if not kills:
        problems.append("no worker container was killed")
    client = docker.from_env()
    for victim in sorted({k["target"] for k in kills}):
        restarts = client.containers.get(victim).attrs["RestartCount"]
        print(f"    {victim}: restarted by the engine {restarts} time(s)")
        if restarts < 1:
            problems.append(f"{victim} was not restarted")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pagedserve.ops.deploy.compose_e2e", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("debian-mirror")
    p.add_argument("suite")
    p = sub.add_parser("free-ports")
    p.add_argument("n", type=int)
    p = sub.add_parser("wait-ready")
    p.add_argument("--scheduler-ops", required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--timeout", type=float, default=900.0)
    p = sub.add_parser("generate")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--max-tokens", type=int, default=24)
    p = sub.add_parser("kill-under-load")
    for flag in ("--project", "--endpoint", "--scheduler-ops", "--block-manager-ops", "--out"):
        p.add_argument(flag, required=True)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--kill-every", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--settle-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    if args.command == "debian-mirror":
        return debian_mirror(args.suite)
    if args.command == "free-ports":
        return free_ports(args.n)
    if args.command == "wait-ready":
        return wait_ready(args.scheduler_ops, args.workers, args.timeout)
    if args.command == "generate":
        return generate(args.endpoint, args.max_tokens)
    return kill_under_load(args)


if __name__ == "__main__":
    sys.exit(main())
