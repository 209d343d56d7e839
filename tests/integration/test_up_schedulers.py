"""`pagedserve up --schedulers 2`: two shards and the router start from the command line, clients reach
both shards through the front endpoint they always used, and SIGTERM stops every process cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from harness.deployment import get_json, metric_sum, sharded_ports, simulated_model, wait_for

from pagedserve import Client


def test_up_with_two_schedulers_serves_through_the_router_and_stops_cleanly(tmp_path):
    front, worker_port, bm, sched_ops, bm_ops, router_ops = sharded_ports(2)
    env = os.environ | {"PAGEDSERVE_LOG_FORMAT": "json"}
    up = subprocess.Popen(
        [
            sys.executable, "-m", "pagedserve.ops.cli", "up", "--no-api", "--schedulers", "2", "--workers", "1",
            "--model", str(simulated_model(tmp_path)), "--simulate-step-ms", "10", "--num-blocks", "64",
            "--log-dir", str(tmp_path / "logs"), "--standby-workers", "0",
            "--front-endpoint", f"tcp://127.0.0.1:{front}", "--worker-endpoint", f"tcp://127.0.0.1:{worker_port}",
            "--block-manager-endpoint", f"tcp://127.0.0.1:{bm}", "--scheduler-ops-port", str(sched_ops),
            "--block-manager-ops-port", str(bm_ops), "--router-ops-port", str(router_ops),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        shards_url = f"http://127.0.0.1:{router_ops}/shards"

        def both_alive() -> bool:
            try:
                return all(s["alive"] for s in get_json(shards_url)["shards"])
            except OSError:
                return False

        assert wait_for(both_alive, 120), "the router never saw both shards"
        with Client(f"tcp://127.0.0.1:{front}", timeout_s=60) as client:
            results = [
                client.generate(prompt_token_ids=[11, 12, i], max_tokens=4, temperature=0.0) for i in range(4)
            ]
        assert all(len(r.token_ids) == 4 for r in results)
        # Each shard's own scheduler finished some of them: idle shards take turns.
        metrics = [
            metric_sum(f"http://127.0.0.1:{sched_ops + 100 * (i + 1)}", "pagedserve_requests_finished_total")
            for i in range(2)
        ]
        assert sum(metrics) == 4 and all(m >= 1 for m in metrics), metrics
    finally:
        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    stopped = next(line for line in out.splitlines() if line.startswith("stopped: "))
    for child in (
        "router",
        "shard-0/scheduler",
        "shard-1/scheduler",
        "shard-0/worker-0",
        "shard-1/block-manager",
    ):
        assert f"{child}=" in stopped, stopped
