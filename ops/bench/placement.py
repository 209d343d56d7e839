"""`pagedserve bench placement`: the router's cache-aware placement against round-robin, on real workers.

    pagedserve bench placement                      2 shards x 1 worker, the bundled model
    pagedserve bench placement --conversations 4 --turns 3   a quick look
    pagedserve bench placement --num-blocks 128     each worker's KV pool cut: the caches under pressure

The workload is multi-turn chat with shared system prompts: `--conversations` conversations run at
once, each under one of `--system-prompts` long system prompts; every turn sends the system prompt,
the whole history and a new user message, and waits for the (greedy, `--max-tokens`) reply before the
next turn (after up to `--think-s` of seeded think time). Each policy gets a fresh deployment (`pagedserve up --schedulers 2` as processes: cold
caches both ways) and the same requests. Reported per policy:

- prefix-cache hit rate: prompt tokens served from the cache over all prompt tokens (each request's
  Usage.cached_tokens, as the shard's block manager counted them);
- TTFT p50 and p90: submit to first streamed token, as the client sees it;
- shard balance: the router's outstanding requests per shard, sampled every 0.25 s; the busiest shard's
  mean over the mean of all shards (1.0 is perfect balance).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pagedserve.ops.deploy import ops_client
from pagedserve.ops.deploy.shards import ShardedDeployment
from pagedserve.ops.results import save_report
from pagedserve.shared.config import add_config_flag

# The words the conversations are made of: business chat, so a system prompt reads as one.
_VOCABULARY = (
    "account billing invoice policy refund customer order shipping delay warehouse contract clause payment "
    "schedule renewal discount tier support ticket escalation priority region language tone summary report "
    "quarter revenue forecast inventory supplier audit compliance review approval"
)
WORDS = _VOCABULARY.split()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="pagedserve bench placement",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_flag(ap, "model")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--policies", default="cache_aware,round_robin", help="router policies, in order")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--system-prompts", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=180, help="words per system prompt (default: 180)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--think-s", type=float, default=0.5, help="most seconds a user waits between turns")
    # Fewer blocks than every conversation needs put the shards' caches under pressure.
    add_config_flag(ap, "num_blocks")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/placement.json"))
    return ap.parse_args(argv)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def system_prompts(args: argparse.Namespace) -> list[str]:
    rng = random.Random(0)
    return [
        f"System: you are assistant {i}. {words(rng, args.system_words)}.\n"
        for i in range(args.system_prompts)
    ]


async def converse(endpoint: str, args: argparse.Namespace, tag: str) -> list[dict[str, Any]]:
    """Every conversation at once, turn after turn; one record per request."""
    from pagedserve.shared.sdk import AsyncClient

    systems = system_prompts(args)
    records: list[dict[str, Any]] = []
    async with AsyncClient(endpoint, timeout_s=600.0) as client:

        async def conversation(c: int) -> None:
            rng = random.Random(1000 + c)
            history = systems[c % len(systems)]
            for turn in range(args.turns):
                # A user reads and types between turns: seeded think time, so that the conversations do
                # not move in lockstep (in lockstep, round-robin over 2 shards sends each conversation
                # to the same shard every turn by accident, and measures affinity, not round-robin).
                await asyncio.sleep(rng.uniform(0.0, args.think_s))
                history += f"User: {words(rng, 20)}?\nAssistant:"
                started = time.monotonic()
                first = None
                stream = client.stream(
                    history, max_tokens=args.max_tokens, temperature=0.0, request_id=f"{tag}-{c}-{turn}"
                )
                async for _ in stream:
                    first = first or time.monotonic()
                result = stream.result
                assert result is not None
                usage = result.usage
                records.append(
                    {
                        "conversation": c,
                        "turn": turn,
                        "ttft_s": (first or time.monotonic()) - started,
                        "prompt_tokens": usage.prompt_tokens,
                        "cached_tokens": usage.cached_tokens,
                    }
                )
                history += result.text + "\n"

        await asyncio.gather(*(conversation(c) for c in range(args.conversations)))
    return records


def sample_shards(url: str, stop: threading.Event, samples: list[list[int]]) -> None:
    while not stop.wait(0.25):
        status, body = ops_client.get(f"{url}/shards", timeout_s=2.0)
        if status == 200:
            samples.append([s["requests"] for s in json.loads(body)["shards"]])


def run_policy(policy: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    from pagedserve.ops.deploy.local_api import local_config
    from pagedserve.ops.deploy.supervisor import resolve_model_first

    config = resolve_model_first(
        local_config(
            args.model,
            router_policy=policy,
            num_threads=1,
            log_level="warning",
            num_blocks=args.num_blocks,
            # No warm spares: nothing fails here, and a spare loading the model steals the first turns' CPU.
            standby_workers=0,
            standby_api=0,
        )
    )
    samples: list[list[int]] = []
    with ShardedDeployment(config, args.shards, 1, log_dir=log_dir / policy) as deployment:
        deployment.wait_ready(timeout_s=args.ready_timeout)
        stop = threading.Event()
        sampler = threading.Thread(
            target=sample_shards, args=(deployment.scheduler_ops_url, stop, samples), daemon=True
        )
        sampler.start()
        started = time.monotonic()
        records = asyncio.run(converse(deployment.front_endpoint, args, policy))
        wall = time.monotonic() - started
        stop.set()
        sampler.join()
    ttfts = sorted(r["ttft_s"] for r in records)
    prompt = sum(r["prompt_tokens"] for r in records)
    per_shard = [statistics.fmean(column) for column in zip(*samples, strict=True)] if samples else []
    mean_load = statistics.fmean(per_shard) if per_shard else 0.0
    return {
        "policy": policy,
        "requests": len(records),
        "seconds": round(wall, 1),
        "prompt_tokens": prompt,
        "cache_hit_rate": round(sum(r["cached_tokens"] for r in records) / prompt, 4) if prompt else None,
        "ttft_p50_s": round(ttfts[len(ttfts) // 2], 3),
        "ttft_p90_s": round(ttfts[int(len(ttfts) * 0.9)], 3),
        "shard_mean_requests": [round(x, 2) for x in per_shard],
        "busiest_shard_over_mean": round(max(per_shard) / mean_load, 3) if mean_load else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pagedserve.ops.bench.report import machine_info
    from pagedserve.shared.log import configure_logging

    configure_logging("bench-placement", "json", "error")
    work = Path(tempfile.mkdtemp(prefix="pagedserve-placement-"))
    rows = []
    for policy in args.policies.split(","):
        row = run_policy(policy.strip(), args, work)
        rows.append(row)
        print(
            f"{row['policy']:>12}: cache hit {row['cache_hit_rate']:.1%}, TTFT p50 {row['ttft_p50_s']:.3f} s "
            f"p90 {row['ttft_p90_s']:.3f} s, busiest shard {row['busiest_shard_over_mean']}x the mean, "
            f"{row['requests']} requests in {row['seconds']} s",
            flush=True,
        )
    report: dict[str, Any] = {
        "settings": {k: str(v) for k, v in vars(args).items() if k != "out"},
        "machine": machine_info(),
        "policies": rows,
    }
    by = {r["policy"]: r for r in rows}
    if {"cache_aware", "round_robin"} <= by.keys():
        aware, rr = by["cache_aware"], by["round_robin"]
        report["cache_hit_ratio"] = (
            round(aware["cache_hit_rate"] / rr["cache_hit_rate"], 2) if rr["cache_hit_rate"] else None
        )
        report["ttft_p50_reduction"] = round(1 - aware["ttft_p50_s"] / rr["ttft_p50_s"], 3)
        print(
            f"cache-aware / round-robin: hit rate x{report['cache_hit_ratio']}, "
            f"p50 TTFT {report['ttft_p50_reduction']:.0%} lower"
        )
    return save_report(args.out, report)


if __name__ == "__main__":
    sys.exit(main())
