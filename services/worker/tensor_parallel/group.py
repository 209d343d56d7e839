"""Rank 0's side of a tensor-parallel group: it starts the other ranks, joins torch.distributed with
them, sends each its orders, and notices at once when one is gone.

The group lives and dies as one. The other ranks are rank 0's children, set to die with it (the
parent-death signal), so a dead rank 0 leaves no orphan; a dead rank > 0 fails rank 0's next
collective (gloo reports the closed connection in milliseconds) or, between steps, its next `check`:
rank 0 then exits non-zero and its supervisor restarts the whole group.

Orders go over one ipc socket per rank, not a torch.distributed broadcast: a rank idle between steps
then waits on a socket with no collective timeout to expire, and a step's inputs (a few KB of
msgpack) take one message instead of a size broadcast and a data broadcast (ops/microbench/tp_orders.py:
~75 us a round against ~0.8-1.4 ms on two shared Zen 3 cores).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import zmq

from pagedserve.services.worker.tensor_parallel.shard import RankShard
from pagedserve.shared import failpoints
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.parent_death import die_with_parent
from pagedserve.shared.protocol.ranks import AttachPool, Forward, ForwardBatch, RankOrder, encode_order

FOLLOWER = "pagedserve.services.worker.tensor_parallel.follower"
FOLDER_PREFIX = "pagedserve-tp-"  # then rank 0's pid


class RankLost(RuntimeError):
    """A rank > 0 exited: the group is broken, and rank 0 must exit so that it restarts whole."""


def join_group(folder: str, rank: int, size: int, device: torch.device, timeout_s: float) -> None:
    """Join torch.distributed: NCCL between GPUs, gloo on CPUs (over loopback). The ranks meet through
    a file in rank 0's fresh folder, not a TCP store on a port picked free and closed (a race with any
    other process binding it). A collective that waits longer than `timeout_s` (a hung peer) raises."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    init = f"file://{folder}/rendezvous"
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=size, timeout=timeout)


def share_cores(config: ServeConfig) -> None:
    """Without `num_threads`, each CPU rank takes its share of the cores torch would give one process:
    N ranks of all the cores each would fight over them at every all-reduce."""
    if config.num_threads is None and torch.device(config.device).type == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads() // config.tensor_parallel_size))


def rank_device(device: str, rank: int) -> torch.device:
    """Rank r's device: the r-th GPU after rank 0's, or the CPU every rank shares."""
    base = torch.device(device)
    return base if base.type != "cuda" else torch.device("cuda", (base.index or 0) + rank)


def sweep_dead_groups() -> None:
    """Remove the folders of groups whose rank 0 died without `stop` (SIGKILLed, crashed): a few
    bytes each, but a chaos run restarts groups by the hundred."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        pid = folder.name.removeprefix(FOLDER_PREFIX).split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's partial `x`, in place (after a row-parallel projection)."""
    dist.all_reduce(x)
    return x


class RankGroup:
    def __init__(self, config: ServeConfig, model_path: Path, log: Any) -> None:
        """Start ranks 1..N-1 on `model_path` (resolved by us: every rank loads the same files) and join
        the group with them (blocks until every rank has joined)."""
        size = config.tensor_parallel_size
        self.shard = RankShard(0, size)
        self.log = log
        share_cores(config)
        # Gloo binds the address the host name resolves to unless told: loopback, as every rank is here.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # The group's own folder: its rendezvous file and the ranks' order sockets.
        sweep_dead_groups()
        self.folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
        self.ranks: list[subprocess.Popen[bytes]] = []
        for rank in range(1, size):
            start = {
                "config": config.model_dump(mode="json"),
                "rank": rank,
                "model_path": str(model_path),
                "folder": str(self.folder),
                "orders": self._endpoint(rank),
                "failpoints": failpoints.spec(),
            }
            proc = subprocess.Popen(
                [sys.executable, "-m", FOLLOWER],
                stdin=subprocess.PIPE,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
            )
            assert proc.stdin is not None  # stdin=PIPE
            proc.stdin.write(json.dumps(start).encode())  # on stdin: the config may hold keys
            proc.stdin.close()
            self.ranks.append(proc)
        log.info("tensor_parallel_ranks_started", size=size, pids=[p.pid for p in self.ranks])
        join_group(str(self.folder), 0, size, rank_device(config.device, 0), config.step_timeout_s)
        self.ctx = zmq.Context()
        self.orders: list[zmq.Socket] = []
        for rank in range(1, size):
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self._endpoint(rank))  # queued until the rank binds, after its load
            self.orders.append(sock)

    def _endpoint(self, rank: int) -> str:
        return f"ipc://{self.folder}/rank-{rank}"

    def loaded(self) -> None:
        """Wait until every rank holds its weights (each is built with the same checks as ours)."""
        dist.barrier()

    def attach_pool(self, num_blocks: int) -> None:
        self._send(AttachPool(num_blocks))

    def forward(self, copies: list[tuple[int, int]], batch: ForwardBatch | None) -> None:
        """Before our own forward: every rank must enter the step's collectives with us."""
        self._send(Forward(copies, batch))

    def _send(self, order: RankOrder) -> None:
        self.check()
        frame = encode_order(order)
        for sock in self.orders:
            sock.send(frame)

    def check(self) -> None:
        """Raise RankLost when a rank has exited (a waitpid each: cheap enough for every loop turn)."""
        for rank, proc in enumerate(self.ranks, 1):
            code = proc.poll()
            if code is not None:
                raise RankLost(f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code {code}")

    def stop(self) -> None:
        """End the other ranks and leave the group (a clean stop; a crash leaves it to the kernel)."""
        for proc in self.ranks:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.ranks:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for sock in self.orders:
            sock.close(0)
        self.ctx.term()
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(self.folder, ignore_errors=True)
