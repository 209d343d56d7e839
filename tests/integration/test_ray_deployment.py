"""`pagedserve up --ray` on a real 3-node Ray cluster on this machine (ray.cluster_utils.Cluster:
a head for the block manager and the scheduler, two nodes with a custom worker resource), driven
as a real subprocess: Ray places and restarts the actors, the services talk ZeroMQ as always.

The tests share one cluster and one deployment (starting them is most of the cost on 2 cores) and
run in file order: the node loss needs both worker nodes, the SIGKILL then works on the survivor,
and the last test stops the deployment.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Ray is an optional extra for users, but the test setup (ops/setup.sh) always installs it: a
# missing ray here is a broken install and must fail, not skip.
import ray
from harness.deployment import blocks, deployment_config, get_text, stream_greedy, wait_for, workers_ready
from harness.greedy_reference import greedy_outputs, random_prompts
from prometheus_client.parser import text_string_to_metric_families
from ray.cluster_utils import Cluster

from pagedserve.ops.deploy.endpoints import ConfigEndpoints
from pagedserve.ops.deploy.supervisor import config_env
from pagedserve.shared.config import ServeConfig

NAMESPACE = "pagedserve"
WORKER_RESOURCE = "pagedserve_worker"
NUM_REQUESTS = 12
MAX_TOKENS = 80
# Small nodes: 2 cores and little memory for three raylets. A dead raylet is noticed in ~1.5 s
# (Ray's default health check is slower; see docs/ray.md).
NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}
HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}


@dataclass
class RayUp(ConfigEndpoints):
    """`pagedserve up --ray` running as a subprocess, and what the tests ask it."""

    proc: subprocess.Popen[bytes]
    config: ServeConfig
    log: Path
    ready_after_s: float

    def status(self, name: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """The actor's pid, service_pid, node_id and restarts; while Ray restarts it, ask again."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                actor = ray.get_actor(name, namespace=NAMESPACE)
                return ray.get(actor.status.remote(), timeout=timeout_s)
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def log_lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def events(self, event: str) -> list[dict[str, Any]]:
        """The driver's own log lines (JSON) named `event`."""
        found = []
        for line in self.log_lines():
            if line.startswith("{") and f'"{event}"' in line:
                record = json.loads(line)
                if record.get("event") == event:
                    found.append(record)
        return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started = time.monotonic()
    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={**NODE, "include_dashboard": False, "_system_config": HEALTH_CHECKS},
    )
    try:
        for _ in range(2):  # room for two workers each: a lost node's worker fits on the other
            cluster.add_node(**NODE, resources={WORKER_RESOURCE: 2})
        cluster.wait_for_nodes()
        print(f"\nray: 3-node cluster up after {time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        ray.shutdown()  # the head cannot be removed while this process is connected to it
        cluster.shutdown()


@pytest.fixture(scope="module")
def model_path(tiny_model) -> Path:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def up(cluster, model_path, tmp_path_factory) -> Iterator[RayUp]:
    logs = tmp_path_factory.mktemp("ray-up")
    config = deployment_config(model_path)
    argv = [sys.executable, "-m", "pagedserve.ops.cli", "up", "--ray", cluster.address, "--workers", "2"]
    argv += ["--no-api", "--ray-worker-resources", json.dumps({WORKER_RESOURCE: 1}), "--log-dir", str(logs)]
    log = logs / "up.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=config_env(config), stdout=out, stderr=subprocess.STDOUT)
    try:
        deployment = RayUp(proc, config, log, 0.0)
        wait_for(lambda: len(workers_ready(deployment)) == 2 or proc.poll() is not None, 180)
        assert proc.poll() is None, (
            f"pagedserve up --ray exited {proc.returncode}:\n{log.read_text()[-4000:]}"
        )
        assert len(workers_ready(deployment)) == 2, log.read_text()[-4000:]
        deployment.ready_after_s = time.monotonic() - started
        print(f"\nray: pagedserve up --ray, 2 workers registered after {deployment.ready_after_s:.1f} s")
        yield deployment
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def expected(model_path) -> list[list[int]]:
    return greedy_outputs(model_path, prompts(), MAX_TOKENS)


def prompts() -> list[list[int]]:
    return random_prompts(NUM_REQUESTS, seed=11, max_len=40)


def pid_alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def workers_lost(up: RayUp) -> float:
    for family in text_string_to_metric_families(get_text(f"{up.scheduler_ops_url}/metrics")):
        if family.name == "pagedserve_workers_lost":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


def pools_whole(up: RayUp, expect_pools: int) -> dict[str, Any] | None:
    snap = blocks(up)
    pools = snap["pools"]
    whole = all(p["totals"]["free"] == p["totals"]["total"] for p in pools)
    return snap if len(pools) == expect_pools and whole else None


async def stream_load(endpoint: str, on_progress) -> list[list[int]]:
    got = await stream_greedy(
        endpoint, prompts(), MAX_TOKENS, "ray", on_progress, heartbeat_s=0.3, reconnect_after_s=1.5
    )
    for streamed, final in got:
        assert streamed == final  # no token duplicated or missing in the stream
    return [streamed for streamed, _ in got]


def exits_of(up: RayUp, child: str) -> list[dict[str, Any]]:
    return [e for e in up.events("child_exited") if e["child"] == child]


def test_workers_are_spread_over_the_nodes_with_the_worker_resource(cluster, up):
    head = cluster.head_node.node_id
    worker_nodes = {node.node_id for node in cluster.worker_nodes}
    placed = {
        name: up.status(name)["node_id"] for name in ("block-manager", "scheduler", "worker-0", "worker-1")
    }

    assert placed["block-manager"] == placed["scheduler"] == head
    assert {placed["worker-0"], placed["worker-1"]} == worker_nodes  # one on each


def test_a_lost_worker_node_mid_decode_changes_no_output_and_its_worker_is_placed_again(
    cluster, up, expected
):
    victim = up.status("worker-1")
    node = next(n for n in cluster.worker_nodes if n.node_id == victim["node_id"])
    survivor = next(n.node_id for n in cluster.worker_nodes if n is not node)
    lost: dict[str, float] = {}

    async def remove_node_once(seen: int) -> None:
        if seen >= 150 and not lost:
            lost["at"] = time.monotonic()
            # Every process of the node at once, as when a machine dies: raylet, actors, services.
            await asyncio.get_running_loop().run_in_executor(None, cluster.remove_node, node, False)

    got = asyncio.run(stream_load(up.front_endpoint, remove_node_once))
    lost["done"] = time.monotonic()
    assert lost, "the load finished before the node was removed: make it longer"
    assert got == expected

    def replaced() -> dict[str, Any] | None:
        status = up.status("worker-1")
        return status if status["node_id"] == survivor else None

    status = wait_for(replaced, 60)
    replaced_s = time.monotonic() - lost["at"]
    assert status, f"worker-1 not placed on the surviving node: {up.status('worker-1')}"
    assert wait_for(lambda: "worker-1" in workers_ready(up), 60), "worker-1 placed but never registered"
    print(
        f"\nray: node lost -> load done {lost['done'] - lost['at']:.1f} s, worker-1 placed again "
        f"{replaced_s:.1f} s, registered {time.monotonic() - lost['at']:.1f} s after the loss"
    )
    assert status["restarts"] == 1 and not pid_alive(victim["service_pid"])
    assert up.status("worker-0")["node_id"] == survivor
    # The cause waits for the cluster to declare the node dead (HEALTH_CHECKS: within ~2 s).
    exited = wait_for(lambda: exits_of(up, "worker-1"), 20) or exits_of(up, "worker-1")
    assert exited and exited[-1]["cause"] == "node lost" and exited[-1]["restart_number"] == 1, exited
    snap = wait_for(lambda: pools_whole(up, expect_pools=2), 20) or blocks(up)
    assert snap["totals"]["leaked"] == 0, snap["totals"]
    assert len(snap["pools"]) == 2 and snap["totals"]["free"] == snap["totals"]["total"], snap["totals"]
    assert snap["invariants"]["ok"], snap["invariants"]


def test_a_sigkilled_worker_actor_is_restarted_by_ray_and_its_worker_registers_again(up):
    before = up.status("worker-0")
    lost_before = workers_lost(up)

    os.kill(before["pid"], signal.SIGKILL)

    assert wait_for(lambda: "worker-0" not in workers_ready(up), 10), "the scheduler never lost worker-0"

    def restarted() -> dict[str, Any] | None:
        status = up.status("worker-0")
        return status if status["pid"] != before["pid"] else None

    after = wait_for(restarted, 60)
    assert after["restarts"] == before["restarts"] + 1
    assert wait_for(lambda: sorted(workers_ready(up)) == ["worker-0", "worker-1"], 60)
    assert workers_lost(up) == lost_before + 1
    assert not pid_alive(before["service_pid"]) and pid_alive(after["service_pid"])
    # A node that stays alive through its health checks (HEALTH_CHECKS: ~5 s) was not lost.
    exited = wait_for(lambda: exits_of(up, "worker-0"), 20) or exits_of(up, "worker-0")
    assert exited and exited[-1]["cause"] == "process died", exited


def test_a_worker_service_that_exits_takes_its_actor_down_and_ray_restarts_both(up):
    before = up.status("worker-1")

    os.kill(before["service_pid"], signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        status = up.status("worker-1")
        return status if status["pid"] != before["pid"] else None

    after = wait_for(restarted, 60)
    assert after and after["restarts"] == before["restarts"] + 1
    assert wait_for(lambda: sorted(workers_ready(up)) == ["worker-0", "worker-1"], 60)
    # The actor said why it went (Ray forwards its output to the driver's terminal).
    said = ("service_exited", "child=worker-1", "cause=SIGKILL")
    assert wait_for(lambda: any(all(w in line for w in said) for line in up.log_lines()), 10)


def test_sigterm_stops_the_services_and_removes_every_actor(up):
    pids = [up.status(name)["service_pid"] for name in ("block-manager", "scheduler", "worker-0", "worker-1")]

    up.proc.send_signal(signal.SIGTERM)

    assert up.proc.wait(60) == 0, up.log.read_text()[-4000:]
    assert [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE] == []
    assert wait_for(lambda: not any(pid_alive(p) for p in pids), 10)
    removed = {e["child"] for e in up.events("child_removed")}
    assert removed == {"block-manager", "scheduler", "worker-0", "worker-1"}
