"""What the live view costs with a 100,000-block pool: the server's encoding per update, the bytes
sent, and the page's render time in headless Chromium, while the pool is busy.

    python -m pagedserve.ops.microbench.live_view [--blocks 100000] [--seconds 20] [--no-browser]

1. The block manager core alone: a pool filled ~60% (tables of 40 blocks, a fifth of them sharing
   a 20-block prefix, some freed so that their prefixes stay cached), `pool_view()` timed.
2. A deployment (block manager, scheduler, one simulated worker holding the same pool), filled the
   same way by a ghost owner over ZeroMQ, with 32 lanes of requests running; `/view/pool` timed
   over HTTP, and the page opened in headless Chromium for `--seconds`: its updates and the time
   each took to decode and draw (`window.pagedserveView.renderMs`).
Results go to bench/results/live_view.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import random
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from pagedserve.ops.results import write_json
from pagedserve.services.block_manager import pool_view
from pagedserve.services.block_manager.manager import BlockManager

BLOCK_SIZE = 16
TABLE_BLOCKS = 40
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "live_view.json"


def fill_prompts(num_blocks: int, seed: int = 0) -> list[list[int]]:
    """Prompts that fill ~60% of the pool: 40 blocks each, every fifth sharing a 20-block prefix."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 300) for _ in range(20 * BLOCK_SIZE)]
    prompts = []
    for i in range(int(0.6 * num_blocks) // TABLE_BLOCKS):
        tail = [rng.randrange(3, 300) for _ in range((TABLE_BLOCKS - (20 if i % 5 == 0 else 0)) * BLOCK_SIZE)]
        prompts.append(shared + tail if i % 5 == 0 else tail)
    return prompts


def core_cost(num_blocks: int, repeats: int = 15) -> dict[str, Any]:
    manager = BlockManager(lease_ttl_s=600.0)
    manager.add_pool("w0", num_blocks, BLOCK_SIZE)
    prompts = fill_prompts(num_blocks)
    for i, prompt in enumerate(prompts):
        manager.allocate("w0", f"r{i}", "bench", prompt, len(prompt), 0.0)
    for i in range(0, len(prompts), 7):  # freed: their blocks go free, their prefixes stay cached
        manager.free(f"r{i}")
    times, locked = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        gathered = manager.pool_view_lists(1.0)  # what the service does under its lock
        locked.append(time.perf_counter() - started)
        view = pool_view.encode(gathered)
        times.append(time.perf_counter() - started)
    body = json.dumps(view).encode()
    started = time.perf_counter()
    zipped = gzip.compress(body, compresslevel=1)
    gzip_s = time.perf_counter() - started
    full_started = time.perf_counter()
    manager.snapshot(1.0)  # what /blocks costs, for comparison
    full_s = time.perf_counter() - full_started
    return {
        "blocks": num_blocks,
        "by_state": view["by_state"],
        "encode_ms_min": round(1e3 * min(times), 2),
        "encode_ms_median": round(1e3 * statistics.median(times), 2),
        "encode_ms_max": round(1e3 * max(times), 2),
        "locked_ms_median": round(1e3 * statistics.median(locked), 2),
        "json_bytes": len(body),
        "gzip_bytes": len(zipped),
        "gzip_ms": round(1e3 * gzip_s, 2),
        "blocks_route_snapshot_ms": round(1e3 * full_s, 1),
    }


def deployment_cost(num_blocks: int, seconds: float, browser: bool) -> dict[str, Any]:
    from pagedserve.ops.bench.fleet import keep_busy, simulated_model
    from pagedserve.ops.deploy.local_api import local_config
    from pagedserve.ops.deploy.supervisor import Supervisor

    work = Path(tempfile.mkdtemp(prefix="live-view-bench-"))
    config = local_config(
        str(simulated_model(work / "model")),
        simulate_step_ms=20.0,
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        lease_ttl_s=600.0,  # the ghost's fill stays for the run
        max_message_bytes=64 << 20,
        max_inflight_per_client=100_000,
        log_level="warning",
    )
    with Supervisor(config, workers=1, log_dir=work) as sup:
        sup.wait_ready(timeout_s=120)
        ghost_fill(config.block_manager_endpoint, fill_prompts(num_blocks))
        until = time.monotonic() + seconds + 15
        load = threading.Thread(
            target=lambda: asyncio.run(keep_busy(config.front_endpoint, 32, 200, until)), daemon=True
        )
        load.start()
        time.sleep(2)
        http = []
        for _ in range(8):
            started = time.perf_counter()
            request = urllib.request.Request(
                f"{sup.scheduler_ops_url}/view/pool", headers={"Accept-Encoding": "gzip"}
            )
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as r:
                wire = len(r.read())
            http.append(time.perf_counter() - started)
            time.sleep(0.6)  # past the shared encoding's age: each GET pays for one encoding
        pool = json.loads(urllib.request.urlopen(f"{sup.block_manager_ops_url}/view/pool", timeout=10).read())
        out: dict[str, Any] = {
            "by_state": pool["by_state"],
            "server_encode_ms": pool["encode_ms"],
            "server_locked_ms": pool["locked_ms"],
            "http_get_ms_median": round(1e3 * statistics.median(http), 1),
            "http_wire_bytes_gzip": wire,
        }
        if browser:
            out |= page_cost(f"{sup.scheduler_ops_url}/view", seconds)
        load.join(timeout=30)
    return out


def ghost_fill(endpoint: str, prompts: list[list[int]]) -> None:
    import zmq

    from pagedserve.shared.protocol.blocks import Alloc, BlockBatch
    from pagedserve.shared.transport import make_socket, send

    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER, max_message_bytes=64 << 20)
    sock.connect(endpoint)
    for start in range(0, len(prompts), 100):
        ops = [
            Alloc("worker-0", f"fill-{i}", "bench-fill", prompts[i], len(prompts[i]))
            for i in range(start, min(start + 100, len(prompts)))
        ]
        send(sock, BlockBatch(start + 1, ops))
        if not sock.poll(30_000):
            raise TimeoutError("the block manager did not answer the fill")
        sock.recv()
    sock.close(0)
    ctx.term()


def page_cost(url: str, seconds: float) -> dict[str, Any]:
    from pagedserve.ops.microbench.chromium import headless_chromium, missing

    if missing():
        raise SystemExit(f"live_view: {missing()} (or run with --no-browser)")
    from selenium.webdriver.support.ui import WebDriverWait

    driver = headless_chromium()
    try:
        started = time.perf_counter()
        driver.get(url)
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script("return window.pagedserveView.updates") >= 1
        )
        first_s = time.perf_counter() - started
        before = driver.execute_script("return window.pagedserveView.updates")
        time.sleep(seconds)
        after, render = driver.execute_script(
            "return [window.pagedserveView.updates, window.pagedserveView.renderMs]"
        )
        return {
            "page_first_update_s": round(first_s, 2),
            "page_updates_per_s": round((after - before) / seconds, 2),
            "page_render_ms_median": round(statistics.median(render), 1),
            "page_render_ms_max": round(max(render), 1),
        }
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--no-browser", action="store_true", help="skip the page (no chromium here)")
    ap.add_argument("--core-only", action="store_true", help="the block manager core alone")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"core": core_cost(args.blocks)}
    print(json.dumps(result["core"], indent=2))
    if not args.core_only:
        result["deployment"] = deployment_cost(args.blocks, args.seconds, not args.no_browser)
        print(json.dumps(result["deployment"], indent=2))
    write_json(RESULTS, result)
    print(f"written to {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
