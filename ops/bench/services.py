"""`pagedserve bench --services`: the workload through the real processes, at several pipeline depths.

A `Supervisor` starts block manager, scheduler and one worker on free loopback ports; one
`AsyncClient` sends every request at once (prompt_token_ids, EOS ignored) and waits for all.
Besides tokens/s we read the scheduler's /metrics before and after the timed run:
- `pagedserve_worker_idle_seconds`: the sum of the worker's `idle_s` (time between sending a
  result and receiving the next step), i.e. how often the pipeline window ran dry;
- `pagedserve_step_seconds` (sum, count): time inside steps, and how many there were.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pagedserve.ops.bench.peers import WARMUP_PROMPTS, WARMUP_TOKENS, BenchSettings, PathResult
from pagedserve.ops.bench.workload import Workload

METRICS = (
    "pagedserve_worker_idle_seconds_total",
    "pagedserve_step_seconds_sum",
    "pagedserve_step_seconds_count",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return parse_metrics(response.read().decode())


def parse_metrics(text: str) -> dict[str, float]:
    """The counters we need from a Prometheus text page, summed over their labels (one worker here)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = dict.fromkeys(METRICS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals


@dataclass(slots=True)
class _Measured:
    counts: list[int]
    warm_end: float  # the warm-up's last result in (perf_counter)
    t0: float
    wall_s: float
    before: dict[str, float]
    after: dict[str, float]


async def _generate_all(
    client: Any, prompts: list[list[int]], output_lens: list[int], temperature: float
) -> list[int]:
    results = await asyncio.gather(
        *(
            client.generate(prompt_token_ids=p, max_tokens=n, temperature=temperature, ignore_eos=True)
            for p, n in zip(prompts, output_lens, strict=True)
        )
    )
    return [len(r.token_ids) for r in results]


async def _warm_then_measure(
    endpoint: str, ops_url: str, workload: Workload, temperature: float
) -> _Measured:
    """Warm up and run on one client, so the warm-up ends when its last result is in (not after the
    client closes): the worker's idle before the run's first step is then this side's to subtract."""
    from pagedserve.shared.sdk import AsyncClient

    async with AsyncClient(endpoint, timeout_s=7200.0) as client:
        await _generate_all(client, WARMUP_PROMPTS, [WARMUP_TOKENS] * len(WARMUP_PROMPTS), temperature)
        warm_end = time.perf_counter()
        before = await asyncio.to_thread(read_metrics, ops_url)
        t0 = time.perf_counter()
        counts = await _generate_all(client, workload.prompts, workload.output_lens, temperature)
        wall_s = time.perf_counter() - t0
    after = await asyncio.to_thread(read_metrics, ops_url)
    return _Measured(counts, warm_end, t0, wall_s, before, after)


def run_services_depth(workload: Workload, settings: BenchSettings, depth: int, threads: int) -> PathResult:
    from pagedserve.ops.deploy.supervisor import Supervisor
    from pagedserve.shared.config import ServeConfig

    config = ServeConfig(
        model=str(settings.model_path),
        dtype=settings.dtype,
        num_threads=threads,
        block_size=settings.block_size,
        kv_cache_memory=settings.kv_cache_memory,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        pipeline_depth=depth,
        front_endpoint=f"tcp://127.0.0.1:{free_port()}",
        worker_endpoint=f"tcp://127.0.0.1:{free_port()}",
        block_manager_endpoint=f"tcp://127.0.0.1:{free_port()}",
        ops_host="127.0.0.1",
        scheduler_ops_port=free_port(),
        block_manager_ops_port=free_port(),
        # Liveness only: on 2 busy shared cores a heartbeat can be late without anything being wrong.
        worker_timeout_s=15.0,
        client_timeout_s=60.0,
        lease_ttl_s=60.0,
        request_timeout_s=7200.0,
        log_format="json",
        log_level="warning",
    )
    log_dir = Path(tempfile.mkdtemp(prefix=f"pagedserve-bench-d{depth}-"))
    result = PathResult(f"services depth={depth}", details={"pipeline_depth": depth, "log_dir": str(log_dir)})
    supervisor = Supervisor(config, workers=1, log_dir=log_dir)
    supervisor.start()
    try:
        supervisor.wait_ready(timeout_s=600)
        m = asyncio.run(
            _warm_then_measure(
                config.front_endpoint, supervisor.scheduler_ops_url, workload, settings.temperature
            )
        )
        result.wall_s = m.wall_s
        result.output_tokens = sum(m.counts)
        delta = {k: m.after[k] - m.before[k] for k in METRICS}
        result.details.update(
            steps=int(delta["pagedserve_step_seconds_count"]),
            # The first step's idle reaches back to the warm-up's last step, across the metrics read
            # before t0 (seconds on a loaded machine, against a wall of under one on a tiny model):
            # that stretch is outside the run, so it comes off.
            idle_fraction=max(0.0, delta["pagedserve_worker_idle_seconds_total"] - (m.t0 - m.warm_end))
            / result.wall_s,
            busy_fraction=delta["pagedserve_step_seconds_sum"] / result.wall_s,
        )
    except Exception as e:  # a deployment that does not come up is a result too: name it and its logs
        result.error = f"{type(e).__name__}: {e} (logs in {log_dir})"
    finally:
        supervisor.stop()
    if result.error is None:
        shutil.rmtree(log_dir, ignore_errors=True)  # logs are kept only when they explain a failure
        result.details.pop("log_dir")
    return result


def run_services(
    workload: Workload, settings: BenchSettings, depths: list[int], threads: int
) -> list[PathResult]:
    results = []
    for depth in depths:
        results.append(run_services_depth(workload, replace(settings, pipeline_depth=depth), depth, threads))
        r = results[-1]
        # Printed as each depth ends: a run stopped half-way still leaves what it measured.
        print(
            f"bench: services depth={depth}: {r.tokens_per_s:.1f} tok/s, idle {r.details.get('idle_fraction', 0):.1%}"
            f" {r.error or ''}",
            file=sys.stderr,
            flush=True,
        )
    return results
