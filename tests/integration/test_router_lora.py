"""LoRA adapters loaded at run time behind the router: the API's load and unload reach every shard
(the router's ops endpoint makes them on each scheduler), so requests for the adapter succeed on
whichever shard they are placed; a refused load leaves no shard holding it."""

from __future__ import annotations

import httpx
from harness.deployment import free_ports, metric_sum, sharded_config
from harness.lora_adapters import make_peft_adapter

from pagedserve.ops.deploy.shards import ShardedDeployment

ADMIN = "admin-secret"


def shard_loras(deployment: ShardedDeployment) -> list[list[str]]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    return [
        sorted(
            a["name"]
            for a in httpx.get(f"{s.scheduler_ops_url}/loras", headers=headers, timeout=10).json()["adapters"]
        )
        for s in deployment.shards
    ]


def test_runtime_adapters_reach_every_shard(tiny_model, tmp_path):
    base = tiny_model("llama")
    adapter = make_peft_adapter(base, tmp_path / "late", seed=3, rank=4)
    config = sharded_config(base, 2, api_port=free_ports(1)[0], max_loras=2, admin_token=ADMIN)
    deployment = ShardedDeployment(config, schedulers=2, workers=1, log_dir=tmp_path / "logs", api=True)
    deployment.start()
    try:
        deployment.wait_ready(timeout_s=120)
        api = deployment.api_base_url
        admin = {"x-admin-token": ADMIN}
        assert shard_loras(deployment) == [[], []]

        refused = httpx.post(
            f"{api}/load_lora_adapter",
            json={"lora_name": "x", "lora_path": str(base)},
            headers=admin,
            timeout=30,
        )
        assert (
            refused.status_code == 400
            and "shard 0: " in refused.text
            and "no adapter_config.json" in refused.text
        )
        assert shard_loras(deployment) == [[], []]

        # Taken by one shard, refused by the other (it holds the name already): undone on the first.
        load = {"lora_name": "late", "lora_path": str(adapter)}
        bearer = {"Authorization": f"Bearer {ADMIN}"}
        shard_1 = deployment.shards[1].scheduler_ops_url
        assert httpx.post(f"{shard_1}/loras/load", json=load, headers=bearer, timeout=30).status_code == 200
        split = httpx.post(f"{api}/load_lora_adapter", json=load, headers=admin, timeout=30)
        assert split.status_code == 400 and "shard 1: " in split.text and "already loaded" in split.text
        assert shard_loras(deployment) == [[], ["late"]]
        unload = {"lora_name": "late"}
        assert (
            httpx.post(f"{shard_1}/loras/unload", json=unload, headers=bearer, timeout=30).status_code == 200
        )

        loaded = httpx.post(f"{api}/load_lora_adapter", json=load, headers=admin, timeout=30)
        assert loaded.status_code == 200, loaded.text
        assert shard_loras(deployment) == [["late"], ["late"]]
        models = [m["id"] for m in httpx.get(f"{api}/models", timeout=10).json()["data"]]
        assert "late" in models

        body = {
            "model": "late",
            "prompt": [5, 9, 77, 31],
            "max_tokens": 6,
            "temperature": 0.0,
            "ignore_eos": True,
        }
        texts = []
        for _ in range(4):  # idle shards take turns: both serve the adapter
            reply = httpx.post(f"{api}/completions", json=body, timeout=60)
            assert reply.status_code == 200, reply.text
            texts.append(reply.json()["choices"][0]["text"])
        assert len(set(texts)) == 1
        assert all(
            metric_sum(s.scheduler_ops_url, "pagedserve_requests_finished_total") >= 1
            for s in deployment.shards
        )  # both shards ran the adapter

        # In use on one shard: that shard refuses the unload, and the other's is undone.
        long = {**body, "max_tokens": 480, "stream": True}
        with httpx.stream("POST", f"{api}/completions", json=long, timeout=60) as live:
            lines = live.iter_lines()  # kept: a dropped iterator closes the response (a disconnect)
            next(lines)
            busy = httpx.post(
                f"{api}/unload_lora_adapter", json={"lora_name": "late"}, headers=admin, timeout=30
            )
            assert busy.status_code == 409 and "in use by running requests" in busy.text, busy.text
            assert shard_loras(deployment) == [["late"], ["late"]]

        unloaded = httpx.post(
            f"{api}/unload_lora_adapter", json={"lora_name": "late"}, headers=admin, timeout=30
        )
        assert unloaded.status_code == 200, unloaded.text
        assert shard_loras(deployment) == [[], []]
    finally:
        deployment.stop()
