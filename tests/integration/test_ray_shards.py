"""`up --ray --schedulers 2`, driven in process: two shards as Ray actors (each a block manager, a
scheduler and one simulated worker, named `shard-<i>-...` in the namespace) behind the router, which
runs beside the driver; requests through the front endpoint are served by both shards, and stop()
removes every actor and disconnects."""

from __future__ import annotations

import ray
from harness.deployment import metric_sum, sharded_config, simulated_model
from ray.cluster_utils import Cluster

from pagedserve import Client
from pagedserve.ops.deploy.ray_placement import RayPlacement
from pagedserve.ops.deploy.shards import ShardedDeployment


def test_two_shards_on_ray_behind_the_router(tmp_path):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 80 << 20})
    try:
        config = sharded_config(simulated_model(tmp_path), 2, simulate_step_ms=10)
        placement = RayPlacement(cluster.address, {"CPU": 0.5})
        deployment = ShardedDeployment(config, 2, 1, log_dir=tmp_path / "logs", ray=placement)
        deployment.start()
        try:
            deployment.wait_ready(timeout_s=180)
            names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True))
            assert [n for n in names if n.startswith("shard-")] == [
                f"shard-{i}-{s}" for i in (0, 1) for s in ("block-manager", "scheduler", "worker-0")
            ]
            with Client(deployment.front_endpoint, timeout_s=60) as client:
                results = [client.generate(prompt_token_ids=[11, 12, i], max_tokens=4) for i in range(4)]
            assert all(len(r.token_ids) == 4 for r in results)
            served = [
                metric_sum(s.scheduler_ops_url, "pagedserve_requests_finished_total")
                for s in deployment.shards
            ]
            assert sum(served) == 4 and min(served) >= 1, served
        finally:
            codes = deployment.stop()
        assert not ray.is_initialized()
        assert {name for name in codes if name.startswith("shard-")} >= {
            "shard-0/scheduler",
            "shard-1/worker-0",
        }
    finally:
        cluster.shutdown()
