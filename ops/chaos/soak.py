"""`pagedserve chaos soak`: many short requests with aborts, timeouts and vanished clients mixed in,
and every service's memory measured along the way, to find leaks that only show after thousands.

    pagedserve chaos soak --model PATH                       10,000 requests, measured at 1k and 10k
    pagedserve chaos soak --model PATH --requests 400 --checkpoints 100,400     the CI size

Request kinds, drawn at random (seeded): `ok` (runs to max_tokens), `abort` (streams, then the
client aborts after its first token), `timeout` (a timeout far shorter than the request needs) and
`disconnect` (a bare socket submits and closes without a word: the scheduler must notice the
silent client and abort its request). At each checkpoint, once the deployment is idle again:

- per-request state back to its idle size: the scheduler holds no request, the block manager no
  lease and no used block, the SDK no live request;
- each process's RSS (/proc) and, for the scheduler, block manager and this process (the SDK),
  its Python object count (the ops endpoint's /process);

Growth from the first checkpoint to the last must stay under `--max-growth` (5%) for every
service and for this process (the SDK; the driver keeps nothing per request). The scheduler's store of finished
results (kept for retries by request id, bounded by `finished_results_kept`) is set to
FINISHED_RESULTS_KEPT here, so it is full by the first checkpoint and its filling is not read as a leak. Workers have no ops endpoint: RSS only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pagedserve.ops.chaos.deployment import DeploymentError
from pagedserve.ops.deploy import ops_client
from pagedserve.ops.deploy.local_api import local_config
from pagedserve.ops.deploy.supervisor import Supervisor, resolve_model_first
from pagedserve.ops.results import write_json
from pagedserve.shared.config import ServeConfig, add_config_flag
from pagedserve.shared.proc_memory import resident_bytes

KINDS = ("ok", "abort", "timeout", "disconnect")
FINISHED_RESULTS_KEPT = 100


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="pagedserve chaos soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(
        ap, "model", required=True, help="checkpoint folder (a tiny model: the soak is about state)"
    )
    ap.add_argument("--workers", type=int, default=1)
    add_config_flag(
        ap,
        "dtype",
        "float32",
        help="the workers' dtype: each has its own linears (float32 few-rows kernel, bf16 oneDNN-packed)",
    )
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument(
        "--checkpoints", default="1000,10000", help="request counts to measure at (default: 1000,10000)"
    )
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--mix", default="ok=70,abort=10,timeout=10,disconnect=10", help="weights of each kind")
    ap.add_argument("--max-growth", type=float, default=0.05, help="allowed growth, first to last checkpoint")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    args = ap.parse_args(argv)
    args.checkpoints = sorted(int(x) for x in args.checkpoints.split(",") if x.strip())
    if not args.checkpoints or args.checkpoints[-1] > args.requests or len(args.checkpoints) < 2:
        ap.error(
            f"--checkpoints needs two or more counts up to --requests ({args.requests}); got {args.checkpoints}"
        )
    mix = dict(part.split("=") for part in args.mix.split(","))
    if set(mix) - set(KINDS):
        ap.error(f"--mix kinds are {', '.join(KINDS)}; got {sorted(mix)}")
    args.mix = {k: float(v) for k, v in mix.items()}
    return args


# ---------------------------------------------------------------- what is measured


def process_view(ops_url: str) -> dict[str, Any]:
    return ops_client.get_json(f"{ops_url}/process", timeout_s=10.0)


def idle_state(sup: Supervisor, client: Any) -> dict[str, Any]:
    requests = ops_client.get_json(f"{sup.scheduler_ops_url}/requests", timeout_s=5.0)
    dump = ops_client.get_json(f"{sup.block_manager_ops_url}/blocks", timeout_s=10.0)
    return {
        "scheduler_requests": len(requests["requests"]),
        "scheduler_waiting": requests["waiting"],
        "scheduler_running": requests["running"],
        "bm_leases": len(dump["leases"]),
        "bm_used_blocks": dump["totals"]["used"],
        "bm_leaked_blocks": dump["totals"]["leaked"],
        "sdk_live_requests": len(client._session.live),  # noqa: SLF001 - the soak inspects the SDK's state
    }


def is_idle(state: dict[str, Any]) -> bool:
    return not any(v for k, v in state.items())


def measure(sup: Supervisor, workers: int, client: Any, done: int) -> dict[str, Any]:
    gc.collect()
    sched, bm = process_view(sup.scheduler_ops_url), process_view(sup.block_manager_ops_url)
    worker_rss = {f"worker-{i}": resident_bytes(sup.pid(f"worker-{i}") or -1) for i in range(workers)}
    return {
        "requests_done": done,
        "rss_bytes": {"scheduler": sched["rss_bytes"], "block-manager": bm["rss_bytes"], **worker_rss}
        | {"soak-client": resident_bytes()},
        "python_objects": {
            "scheduler": sched["python_objects"],
            "block-manager": bm["python_objects"],
            "soak-client": len(gc.get_objects()),
        },
        "idle": idle_state(sup, client),
        "sdk_tracked_requests": client._session.num_tracked,  # noqa: SLF001 - bounded, not zero: see Session
    }


def growth(first: dict[str, Any], last: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for what in ("rss_bytes", "python_objects"):
        out[what] = {
            name: None if not a or last[what].get(name) is None else round((last[what][name] - a) / a, 4)
            for name, a in first[what].items()
        }
    return out


# ---------------------------------------------------------------- the load


async def vanish(endpoint: str, request_id: str, prompt: list[int]) -> None:
    """A client that submits and disappears: no abort, no heartbeat, its socket just closes."""
    import zmq
    import zmq.asyncio

    from pagedserve.shared.protocol.frontend import Submit
    from pagedserve.shared.protocol.messages import encode_message

    ctx = zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    from pagedserve.shared.protocol.frontend import SamplingParams

    # Long enough to still run when the scheduler's client timeout comes: the abort must do it.
    sampling = SamplingParams(max_tokens=300, ignore_eos=True)
    submit = Submit(request_id=request_id, prompt_token_ids=prompt, sampling=sampling)
    await sock.send(encode_message(submit))
    await sock.recv()  # Accepted: it is live on the scheduler, now go
    sock.close(0)


async def one(client: Any, endpoint: str, kind: str, rid: str, prompt: list[int], max_tokens: int) -> str:
    from pagedserve.shared.sdk import RequestError

    try:
        if kind == "ok":
            await client.generate(
                prompt_token_ids=prompt, request_id=rid, max_tokens=max_tokens, ignore_eos=True
            )
        elif kind == "abort":
            stream = client.stream(prompt_token_ids=prompt, request_id=rid, max_tokens=64, ignore_eos=True)
            async for _ in stream:
                break
            await stream.aclose()
        elif kind == "timeout":
            await client.generate(prompt_token_ids=prompt, request_id=rid, max_tokens=256, timeout_s=0.05)
        else:
            await vanish(endpoint, rid, prompt)
        return kind
    except RequestError as e:
        return f"{kind}:{e.code}"


async def soak(sup: Supervisor, args: argparse.Namespace) -> dict[str, Any]:
    from pagedserve.shared.sdk import AsyncClient

    rng = random.Random(args.seed)
    kinds, weights = list(args.mix), list(args.mix.values())
    run = uuid.uuid4().hex[:6]
    outcomes: collections.Counter[str] = collections.Counter()
    checkpoints: list[dict[str, Any]] = []
    done = 0
    started = time.monotonic()
    async with AsyncClient(sup.front_endpoint, timeout_s=60.0) as client:
        for target in args.checkpoints:
            # A few lanes draw requests one at a time: the driver holds nothing per request (no
            # batch of prompts, no list of results), so its own growth is the SDK's.
            next_index = done

            async def lane(target: int = target) -> None:
                nonlocal next_index
                while next_index < target:
                    i, next_index = next_index, next_index + 1
                    kind = rng.choices(kinds, weights)[0]
                    prompt = [rng.randrange(3, 250) for _ in range(rng.randint(4, 24))]
                    outcomes[
                        await one(
                            client, sup.front_endpoint, kind, f"soak-{run}-{i}", prompt, args.max_tokens
                        )
                    ] += 1

            await asyncio.gather(*(lane() for _ in range(args.concurrency)))
            done = target
            state = await settle(sup, client, timeout_s=sup.config.client_timeout_s + 30.0)
            point = await asyncio.to_thread(measure, sup, args.workers, client, done)
            point["idle_after_s"] = state
            point["elapsed_s"] = round(time.monotonic() - started, 1)
            checkpoints.append(point)
            print(f"{done:6d} requests: {json.dumps(point)}", flush=True)
    return {"outcomes": dict(outcomes), "checkpoints": checkpoints}


async def settle(sup: Supervisor, client: Any, timeout_s: float) -> float | None:
    """Seconds until every per-request table is empty again (vanished clients take client_timeout_s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if is_idle(await asyncio.to_thread(idle_state, sup, client)):
            return round(time.monotonic() - t0, 2)
        await asyncio.sleep(0.25)
    return None


def soak_config(model: str, dtype: str = "float32") -> ServeConfig:
    return local_config(
        model,
        dtype=dtype,
        num_threads=1,
        num_blocks=256,
        client_timeout_s=2.0,  # a vanished client is noticed in seconds, not the default 10
        # The retry store is bounded by design; kept smaller than the first checkpoint it is already
        # full there, so growth between checkpoints is per-request state that should not be left.
        finished_results_kept=FINISHED_RESULTS_KEPT,
        log_level="warning",
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = resolve_model_first(soak_config(args.model, args.dtype))
    except ValueError as e:
        print(f"pagedserve chaos soak: {e}", file=sys.stderr)
        return 2
    log_dir = Path(tempfile.mkdtemp(prefix="pagedserve-soak-"))
    with Supervisor(config, workers=args.workers, log_dir=log_dir) as sup:
        try:
            sup.wait_ready(timeout_s=300)
        except TimeoutError as e:
            raise DeploymentError(str(e)) from e
        result = asyncio.run(soak(sup, args))
        restarts = {name: sup.restarts(name) for name in sup.group.names()}
    first, last = result["checkpoints"][0], result["checkpoints"][-1]
    grown = growth(first, last)
    failures = [
        f"not idle after {c['requests_done']}: {c['idle']}"
        for c in result["checkpoints"]
        if not is_idle(c["idle"])
    ]
    failures += [
        f"{what} of {name} grew {g:.1%}"
        for what, by_name in grown.items()
        for name, g in by_name.items()
        # soak-client is this process: the SDK and a driver that keeps nothing per request.
        if g is not None and g > args.max_growth
    ]
    failures += [f"{name} restarted {n} time(s)" for name, n in restarts.items() if n]
    report = {
        "ok": not failures,
        "failures": failures,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        **result,
        "growth": grown,
        # Between consecutive checkpoints: a bounded store fills and then stops; a leak keeps going.
        "growth_between_checkpoints": [
            growth(a, b) for a, b in zip(result["checkpoints"], result["checkpoints"][1:], strict=False)
        ],
        "restarts": restarts,
        "log_dir": str(log_dir),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    print(("PASS" if report["ok"] else "FAIL: " + "; ".join(failures)) + f"\nJSON: {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
