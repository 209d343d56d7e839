"""Chaos tests whose failpoint SIGSTOPs worker-0 (or one of its tensor-parallel ranks) at one point of
its work: the deployment around it, greedy streams that SIGKILL the process once it is seen stopped,
and the check that all came back."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.deployment import assert_no_leak, start, stream_greedy, wait_for, workers_ready
from pagedserve.ops.deploy.supervisor import Supervisor


def stopped(pid: int | None) -> bool:
    """Whether the process is stopped (state T in /proc), as a `stop` failpoint leaves it."""
    if pid is None:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def rank_pid(worker_pid: int | None, rank: int) -> int | None:
    """The pid of a worker's tensor-parallel rank `rank` (> 0): its children that run a rank, in the
    order it started them."""
    if worker_pid is None:
        return None
    try:
        children = Path(f"/proc/{worker_pid}/task/{worker_pid}/children").read_text().split()
        ranks = [
            int(c) for c in children if b"tensor_parallel.follower" in Path(f"/proc/{c}/cmdline").read_bytes()
        ]
    except OSError:
        return None
    return ranks[rank - 1] if len(ranks) >= rank else None


@contextmanager
def worker_0_stopping_at(
    failpoint: str, model: Path | str, log_dir: Path, workers: int = 2, **overrides: Any
) -> Iterator[Supervisor]:
    """A deployment of `workers` (all ready) whose worker-0 arms `failpoint` (a failpoints spec ending
    in `stop`). On exit worker-0 is continued before the deployment stops: a stopped process's
    SIGTERM stays pending."""
    sup = start(model, workers=workers, log_dir=log_dir, failpoints={"worker-0": failpoint}, **overrides)
    try:
        assert wait_for(lambda: len(workers_ready(sup)) == workers, 30)
        yield sup
    finally:
        sup.kill_worker(0, signal.SIGCONT)
        sup.stop()


def stream_killing_worker_0(
    sup: Supervisor,
    prompts: list[list[int]],
    max_tokens: int,
    request_prefix: str,
    rank: int = 0,
    **stream_options: Any,
) -> list[tuple[list[int], list[int]]]:
    """stream_greedy's result for `prompts` through `sup`, worker-0 (`rank` > 0: that tensor-parallel
    rank of it) SIGKILLed once when seen stopped: looked for on every delta and every 50 ms (it may
    stop before a token streams). Fails unless it was killed, as then the failpoint never fired."""
    killed: list[int] = []

    async def kill_when_stopped(_seen: int = 0) -> None:
        pid = sup.pid("worker-0") if rank == 0 else rank_pid(sup.pid("worker-0"), rank)
        if killed or pid is None or not stopped(pid):
            return
        if rank == 0:
            killed.append(sup.kill_worker(0, signal.SIGKILL))
        else:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    async def poll() -> None:
        while not killed:
            await kill_when_stopped()
            await asyncio.sleep(0.05)

    async def run() -> list[tuple[list[int], list[int]]]:
        watcher = asyncio.create_task(poll())
        try:
            return await stream_greedy(
                sup.front_endpoint,
                prompts,
                max_tokens,
                request_prefix,
                kill_when_stopped,
                timeout_s=120,
                heartbeat_s=0.3,
                reconnect_after_s=1.5,
                **stream_options,
            )
        finally:
            watcher.cancel()

    got = asyncio.run(run())
    assert killed, "worker-0 never stopped: its failpoint did not fire"
    return got


def assert_both_workers_back(sup: Supervisor) -> None:
    """After the kill: the restarted worker-0 ready beside worker-1, every block of both pools free."""
    assert wait_for(lambda: len(workers_ready(sup)) == 2, 30)
    assert_no_leak(sup, 2)
