"""How long a killed API process takes to serve again, as `pagedserve chaos` counts it.

    python -m pagedserve.ops.microbench.api_restart [--model smollm2-135m] [--kills 10] \
        [--out bench/results/api_restart.json]

Starts a deployment (block manager, scheduler, one worker, the API) under the supervisor with the
chaos run's restart policy, then SIGKILLs the API process `--kills` times: each time from the kill
until its /health answers 200 again (the scheduler answers and has a ready worker) and until a
one-token chat completion is answered. The API logs what its own start spent (`api_start_phases`):
those phases are reported too. Name the CPU and the load beside any number you quote.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from pagedserve.kernels.cpu.isa import cpu_model
from pagedserve.ops.chaos.deployment import CHAOS_RESTARTS
from pagedserve.ops.deploy.local_api import local_config
from pagedserve.ops.deploy.supervisor import Supervisor
from pagedserve.ops.results import write_json
from pagedserve.shared.config import add_config_flag


def _until(check: Any, timeout_s: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        try:
            if check():
                return time.perf_counter() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"not within {timeout_s} s")


def _phases(log: Path) -> list[dict[str, float]]:
    out = []
    for line in log.read_text().splitlines():
        if '"api_start_phases"' in line:
            entry = json.loads(line)
            out.append({k: v for k, v in entry.items() if k.endswith("_s")})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flag(ap, "model")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("bench/results/api_restart.json"))
    args = ap.parse_args(argv)
    config = local_config(args.model, num_blocks=256)
    log_dir = Path(tempfile.mkdtemp(prefix="pagedserve-api-restart-"))
    sup = Supervisor(config, workers=1, log_dir=log_dir, policy=CHAOS_RESTARTS, api=True)
    sup.start()
    base = f"http://127.0.0.1:{config.api_port}"
    health, answered = [], []
    try:
        sup.wait_ready(timeout_s=600)
        _until(lambda: httpx.get(f"{base}/health", timeout=1).status_code == 200, 300)
        model = httpx.get(f"{base}/v1/models", timeout=5).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        for _ in range(args.kills):
            time.sleep(1.0)
            sup.kill("api")
            killed = time.perf_counter()
            _until(lambda: httpx.get(f"{base}/health", timeout=1).status_code == 200, 120)
            health.append(time.perf_counter() - killed)
            _until(
                lambda: httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30).status_code == 200,
                120,
            )
            answered.append(time.perf_counter() - killed)
    finally:
        sup.stop()
    phases = _phases(log_dir / "api.log")
    report = {
        "benchmark": "api_restart",
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "model": args.model,
        "kills": args.kills,
        "health_after_kill_s": {"median": statistics.median(health), "max": max(health), "all": health},
        "chat_after_kill_s": {"median": statistics.median(answered), "max": max(answered), "all": answered},
        "start_phases_median_s": {
            k: statistics.median(p[k] for p in phases if k in p) for k in (phases[-1] if phases else {})
        },
        "log_dir": str(log_dir),
    }
    print(json.dumps({k: v for k, v in report.items() if k != "log_dir"}, indent=1))
    write_json(args.out, report)


if __name__ == "__main__":
    main()
