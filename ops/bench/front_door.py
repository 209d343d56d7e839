"""`pagedserve bench front-door`: many concurrent HTTP clients against the OpenAI API of a deployment,
for a bounded time; does every request end, and do the ops endpoints stay responsive?

    pagedserve bench front-door --start 2 --api-processes 2 --clients 1000 --duration 600   the full run
    pagedserve bench front-door --start 1 --clients 50 --duration 30                        a smoke
    pagedserve bench front-door --base-url http://127.0.0.1:8000/v1 --scheduler-ops http://127.0.0.1:8080

Each client loops until the duration is over: one completion (half of them streamed, drawn per
request from a seeded RNG), then the next. Recorded per request: TTFT (streams: the first content
chunk), E2E, and how it ended: `ok`, `429`, `503`, another error, or `hung` (no end within
`--request-timeout`). Every second: each deployment process's RSS (with --start) and the latency of
the scheduler's /healthz and /metrics and the block manager's /blocks. The JSON report and a PNG
beside it go to `--out` (bench/results/front-door.json by default). Exit 0 only if nothing hung,
no error other than 429/503 came back, and every ops probe answered in under 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from pagedserve.kernels.cpu.isa import cpu_model
from pagedserve.shared.config import add_config_flag
from pagedserve.shared.proc_memory import resident_bytes

OPS_LIMIT_S = 1.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="pagedserve bench front-door",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument(
        "--duration", type=float, default=600.0, help="seconds of load (then in-flight requests end)"
    )
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--stream-fraction", type=float, default=0.5)
    ap.add_argument("--request-timeout", type=float, default=300.0, help="a request longer than this is hung")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/front-door.json"))
    where = ap.add_argument_group("deployment")
    where.add_argument(
        "--start", type=int, default=None, metavar="N", help="start N workers and the API here"
    )
    add_config_flag(where, "model", help="with --start")
    add_config_flag(where, "api_processes", 1, help="with --start")
    where.add_argument("--threads", type=int, default=1, help="with --start: torch threads per worker")
    add_config_flag(where, "api_keep_alive_s", help="with --start: the API's idle-connection timeout")
    where.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="without --start")
    where.add_argument("--scheduler-ops", default="http://127.0.0.1:8080", help="without --start")
    where.add_argument("--block-manager-ops", default="http://127.0.0.1:8081", help="without --start")
    return ap.parse_args(argv)


def raise_open_files_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


async def one_request(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], timeout_s: float
) -> dict[str, Any]:
    t0 = time.monotonic()
    record: dict[str, Any] = {"stream": body["stream"], "at": time.time(), "ttft_s": None}
    try:
        async with asyncio.timeout(timeout_s):
            if body["stream"]:
                async with http.stream("POST", url, json=body) as reply:
                    if reply.status_code != 200:
                        await reply.aread()
                        record["end"] = str(reply.status_code)
                    else:
                        done = False
                        async for line in reply.aiter_lines():
                            if (
                                line.startswith("data: ")
                                and record["ttft_s"] is None
                                and line != "data: [DONE]"
                            ):
                                record["ttft_s"] = time.monotonic() - t0
                            if line == "data: [DONE]":
                                done = True
                            elif '"error"' in line:
                                record["end"] = "stream_error"
                        record.setdefault("end", "ok" if done else "truncated")
            else:
                reply = await http.post(url, json=body)
                record["end"] = "ok" if reply.status_code == 200 else str(reply.status_code)
    except TimeoutError:
        record["end"] = "hung"
    except httpx.HTTPError as e:
        record["end"] = f"transport:{type(e).__name__}"
    record["e2e_s"] = time.monotonic() - t0
    return record


async def run_clients(args: argparse.Namespace, base_url: str, model: str) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.duration
    records: list[dict[str, Any]] = []
    # The pool drops an idle connection after 5 s, well before the server does (api_keep_alive_s,
    # 75 s): the side that closes first must be the one with no request on the way.
    limits = httpx.Limits(
        max_connections=args.clients + 16, max_keepalive_connections=args.clients + 16, keepalive_expiry=5.0
    )
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:

        async def client(i: int) -> None:
            crng = random.Random(rng.random())
            while time.monotonic() < deadline:
                body = {
                    "model": model,
                    "prompt": [crng.randrange(3, 300) for _ in range(crng.randrange(4, 64))],
                    "max_tokens": args.max_tokens,
                    "ignore_eos": True,
                    "temperature": 0,
                    "stream": crng.random() < args.stream_fraction,
                    "user": f"client-{i}",
                }
                records.append(await one_request(http, f"{base_url}/completions", body, args.request_timeout))

        await asyncio.gather(*(client(i) for i in range(args.clients)))
    return records


def rss_mib(pid: int) -> float | None:
    rss = resident_bytes(pid)
    return None if rss is None else rss / 2**20


def sample(
    stop: threading.Event, ops_urls: list[str], pids: Any, out: dict[str, list[Any]], t0: float
) -> None:
    """Once a second: every process's RSS and every ops probe's latency, into `out`."""
    with httpx.Client(timeout=5.0) as http:
        while not stop.wait(1.0):
            now = round(time.monotonic() - t0, 1)
            for url in ops_urls:
                p0 = time.monotonic()
                try:
                    ok = http.get(url).status_code < 500
                except httpx.HTTPError:
                    ok = False
                out.setdefault("ops", []).append([now, url, round(time.monotonic() - p0, 4), ok])
            for name, pid in pids().items():
                if (mib := rss_mib(pid)) is not None:
                    out.setdefault("rss", []).append([now, name, round(mib, 1)])


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(float(np.percentile(values, q * 100)), 4)


def summarize(
    records: list[dict[str, Any]], samples: dict[str, list[Any]], args: argparse.Namespace
) -> dict[str, Any]:
    ends: dict[str, int] = {}
    for r in records:
        ends[r["end"]] = ends.get(r["end"], 0) + 1
    ok = [r for r in records if r["end"] == "ok"]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    e2e = [r["e2e_s"] for r in ok]
    other_errors = sum(n for end, n in ends.items() if end not in ("ok", "429", "503", "hung"))
    ops = samples.get("ops", [])
    ops_max = max((o[2] for o in ops), default=None)
    ops_failed = sum(1 for o in ops if not o[3] or o[2] >= OPS_LIMIT_S)
    rss_by: dict[str, list[float]] = {}
    for _, name, mib in samples.get("rss", []):
        rss_by.setdefault(name, []).append(mib)
    return {
        "clients": args.clients,
        "duration_s": args.duration,
        "max_tokens": args.max_tokens,
        "stream_fraction": args.stream_fraction,
        "requests": len(records),
        "ends": ends,
        "hung": ends.get("hung", 0),
        "rejected_429": ends.get("429", 0),
        "unavailable_503": ends.get("503", 0),
        "other_errors": other_errors,
        "ttft_s": {"p50": percentile(ttft, 0.5), "p99": percentile(ttft, 0.99)},
        "e2e_s": {
            "p50": percentile(e2e, 0.5),
            "p99": percentile(e2e, 0.99),
            "mean": statistics.fmean(e2e) if e2e else None,
        },
        "ops_max_latency_s": ops_max,
        "ops_probes_over_1s_or_failed": ops_failed,
        "rss_mib": {n: {"first": v[0], "max": max(v), "last": v[-1]} for n, v in rss_by.items()},
        "load_average": list(os.getloadavg()),
        "cpu": cpu_model(),
        "passed": ends.get("hung", 0) == 0 and other_errors == 0 and ops_failed == 0 and bool(records),
    }


def write_png(path: Path, records: list[dict[str, Any]], samples: dict[str, list[Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rss, ax_ops, ax_e2e) = plt.subplots(3, 1, figsize=(10, 9), sharex=False)
    series: dict[str, tuple[list[float], list[float]]] = {}
    for t, name, mib in samples.get("rss", []):
        xs, ys = series.setdefault(name, ([], []))
        xs.append(t)
        ys.append(mib)
    for name, (xs, ys) in sorted(series.items()):
        ax_rss.plot(xs, ys, label=name)
    ax_rss.set_ylabel("RSS MiB")
    ax_rss.legend(fontsize=7, ncol=4)
    by_url: dict[str, tuple[list[float], list[float]]] = {}
    for t, url, lat, _ in samples.get("ops", []):
        xs, ys = by_url.setdefault(url.rsplit("/", 1)[-1], ([], []))
        xs.append(t)
        ys.append(lat * 1000)
    for name, (xs, ys) in by_url.items():
        ax_ops.plot(xs, ys, label=f"/{name}")
    ax_ops.axhline(OPS_LIMIT_S * 1000, color="red", linestyle="--", linewidth=0.8)
    ax_ops.set_ylabel("ops latency ms")
    ax_ops.legend(fontsize=7)
    if records:
        t0 = min(r["at"] for r in records)
        colors = {"ok": "tab:green", "429": "tab:orange", "503": "tab:purple"}
        for end in sorted({r["end"] for r in records}):
            pts = [(r["at"] - t0, r["e2e_s"]) for r in records if r["end"] == end]
            ax_e2e.scatter(
                [p[0] for p in pts], [p[1] for p in pts], s=2, label=end, color=colors.get(end, "tab:red")
            )
        ax_e2e.legend(fontsize=7)
    ax_e2e.set_ylabel("E2E s")
    ax_e2e.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_open_files_limit(args.clients * 2 + 256)
    sup = None
    if args.start is not None:
        from pagedserve.ops.deploy.local_api import local_config
        from pagedserve.ops.deploy.supervisor import Supervisor, resolve_model_first

        config = resolve_model_first(
            local_config(
                args.model,
                api_processes=args.api_processes,
                **({} if args.api_keep_alive_s is None else {"api_keep_alive_s": args.api_keep_alive_s}),
                num_threads=args.threads,
            )
        )
        log_dir = args.out.with_suffix("").with_name(args.out.stem + "-logs")
        sup = Supervisor(config, workers=args.start, log_dir=log_dir, api=True).start()
        sup.wait_ready(timeout_s=600)
        base_url = sup.api_base_url
        scheduler_ops, bm_ops_url = sup.scheduler_ops_url, sup.block_manager_ops_url
        pids = lambda: {n: p for n in sup.group.names() if (p := sup.pid(n)) is not None}  # noqa: E731
    else:
        base_url, scheduler_ops, bm_ops_url = args.base_url, args.scheduler_ops, args.block_manager_ops
        pids = lambda: {}  # noqa: E731 - processes we did not start: ops latency only
    try:
        deadline = time.monotonic() + 120
        while True:  # the API answers once its SDK client has connected
            try:
                model = httpx.get(f"{base_url}/models", timeout=5).json()["data"][0]["id"]
                break
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        samples: dict[str, list[Any]] = {}
        stop = threading.Event()
        urls = [f"{scheduler_ops}/healthz", f"{scheduler_ops}/metrics", f"{bm_ops_url}/blocks"]
        t0 = time.monotonic()
        sampler = threading.Thread(target=sample, args=(stop, urls, pids, samples, t0), daemon=True)
        sampler.start()
        print(
            f"front-door: {args.clients} clients for {args.duration:.0f} s against {base_url}",
            file=sys.stderr,
        )
        records = asyncio.run(run_clients(args, base_url, model))
        stop.set()
        sampler.join()
    finally:
        if sup is not None:
            sup.stop()
    report = summarize(records, samples, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    failures = [r for r in records if r["end"] not in ("ok", "429", "503")]  # each one, to read
    args.out.write_text(json.dumps({**report, "failures": failures, "samples": samples}, indent=1))
    write_png(args.out.with_suffix(".png"), records, samples)
    print(json.dumps(report, indent=1))
    return 0 if report["passed"] else 1
