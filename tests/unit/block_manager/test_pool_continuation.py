"""The block-manager service keeps a pool's tables across its worker's restart when the pool continues.

A restarted worker that mapped the same shared-memory segment registers with the segment's epoch:
same epoch and size, and the pool's tables and prefix cache stay (the scheduler resumes the
requests); another epoch, or a private pool, and they are dropped as before. A silent persistent
pool is kept while the scheduler may still be waiting for its worker.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness.deployment import deployment_config

from pagedserve.services.block_manager.service import BlockManagerService
from pagedserve.shared.protocol.control import Heartbeat, Register


@pytest.fixture
def service() -> Iterator[BlockManagerService]:
    bm = BlockManagerService(deployment_config("unused", block_manager_ops_port=0, kv_resume_timeout_s=10.0))
    yield bm
    bm.close()


def announce(incarnation: str, epoch: str, num_blocks: int = 32, kind: type = Register) -> Register:
    return kind("worker-0", incarnation, num_blocks, 16, 4096, pool_epoch=epoch)


def with_a_request(bm: BlockManagerService) -> None:
    bm.core.allocate("worker-0", "r1", "sched", list(range(1, 40)), 39, 0.0)


def test_a_restart_on_the_same_segment_keeps_the_tables_and_says_so(service):
    service.register(announce("i1", "epoch-a"), 0.0)
    with_a_request(service)
    assert not service.continued["worker-0"]
    service.register(announce("i2", "epoch-a"), 1.0)
    assert service.continued["worker-0"] and service.core.table("r1") is not None


@pytest.mark.parametrize(
    ("epoch", "num_blocks"),
    [("epoch-b", 32), ("epoch-a", 64), ("", 32)],
    ids=["other segment", "other size", "private pool"],
)
def test_any_other_pool_drops_the_tables(service, epoch, num_blocks):
    service.register(announce("i1", "epoch-a"), 0.0)
    with_a_request(service)
    service.register(announce("i2", epoch, num_blocks), 1.0)
    assert not service.continued["worker-0"] and service.core.table("r1") is None


def test_a_private_pool_is_never_continued(service):
    service.register(announce("i1", ""), 0.0)
    with_a_request(service)
    service.register(announce("i2", ""), 1.0)
    assert service.core.table("r1") is None


def test_a_silent_persistent_pool_waits_for_its_worker_and_a_private_one_does_not(service):
    service.register(announce("i1", "epoch-a"), 0.0)
    service.register(Register("worker-1", "j1", 32, 16, 4096), 0.0)
    with_a_request(service)
    timeout = service.config.worker_timeout_s
    service.drop_silent_workers(timeout + 1.0)
    assert service.core.has_pool("worker-0") and not service.core.has_pool("worker-1")
    service.register(announce("i1", "epoch-a", kind=Heartbeat), timeout + 2.0)  # back in time (a pause)
    service.drop_silent_workers(timeout + 2.0 + timeout + 9.0)
    assert service.core.table("r1") is not None
    service.drop_silent_workers(timeout + 2.0 + timeout + 10.5)  # then silent past the resume window
    assert not service.core.has_pool("worker-0")
