"""A tensor-parallel rank > 0: loads its slice of the model, then runs each forward rank 0 orders.

It keeps no request state, samples nothing and talks to no service: rank 0 packs every step's batch
and sends it here (orders.py); this rank writes its kv heads' K/V into its own pool (as many blocks
as rank 0's, the same block ids) and joins the step's all-reduces. Started by rank 0 (group.py), with
its start-up facts as JSON on stdin; it dies with rank 0.

    python -m pagedserve.services.worker.tensor_parallel.follower < start.json
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import zmq

from pagedserve.services.worker.runner import ModelRunner
from pagedserve.services.worker.tensor_parallel import GroupRefused
from pagedserve.services.worker.tensor_parallel.group import join_group, rank_device, share_cores
from pagedserve.services.worker.tensor_parallel.orders import forward_inputs
from pagedserve.services.worker.tensor_parallel.shard import RankShard
from pagedserve.shared import failpoints
from pagedserve.shared.config import config_of
from pagedserve.shared.log import configure_logging
from pagedserve.shared.protocol.ranks import AttachPool, Forward, decode_order


@torch.inference_mode()
def follow(runner: ModelRunner, order: Forward) -> None:
    """The part of ModelRunner.execute that every rank runs: copy-on-write, then the forward."""
    if order.copies:
        runner.kv_cache.copy_blocks(order.copies)
    if order.batch is None:
        return
    input_ids, positions, meta, long_tokens = forward_inputs(order.batch, runner.device)
    failpoints.fire("worker.rank_forward")
    runner.model(input_ids, positions, runner.kv_cache.layers(), meta, long_tokens)


def main() -> None:
    start = json.loads(sys.stdin.read())
    parent = os.getppid()
    config = config_of(**start["config"])
    rank = int(start["rank"])
    failpoints.configure(start["failpoints"])
    log = configure_logging("worker", config.log_format, config.log_level).bind(
        worker_id=config.worker_id, rank=rank
    )
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    share_cores(config)
    device = rank_device(config.device, rank)
    join_group(start["folder"], rank, config.tensor_parallel_size, device, config.step_timeout_s)
    try:
        runner = ModelRunner.from_config(
            start["model_path"],
            config.model_copy(update={"device": str(device)}),
            shard=RankShard(rank, config.tensor_parallel_size),
            prepack_weights=config.prepack_weights,
            defer_pool=True,  # rank 0 sizes the pool; we allocate as many blocks
        )
    except GroupRefused:
        sys.exit(1)  # rank 0 runs the same check and says why, once

    dist.barrier()  # RankGroup.loaded: every rank holds its weights
    ctx = zmq.Context()
    orders = ctx.socket(zmq.PULL)
    orders.bind(start["orders"])
    log.info("tensor_parallel_rank_ready", device=str(device), kv_heads=runner.kv_shape.num_kv_heads)
    while True:
        if not orders.poll(1000):
            if os.getppid() != parent:  # the parent-death signal is the rule; this, the belt
                return
            continue
        order = decode_order(orders.recv())
        if isinstance(order, AttachPool):
            runner.attach_pool(num_blocks=order.num_blocks)
            log.info("tensor_parallel_pool_attached", num_blocks=order.num_blocks)
        else:
            follow(runner, order)


if __name__ == "__main__":
    main()
