"""Giving a worker its KV pool once it knows its name: private memory, or its shared-memory segment.

With `kv_segment_dir` (set by `pagedserve up` on the CPU) the pool lives in `<dir>/<worker_id>.kv`
(kv_segment.py): a restarted worker of the same name maps the same bytes and, when their layout is
proven, continues them; the block manager then keeps the pool's tables (it checks the segment's
epoch) and the scheduler resumes the requests it was running. Without it, or on a GPU (CUDA IPC /
VMM: docs/kv-persistence.md, not built), the pool is private and dies with the process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagedserve.services.worker.kv_segment import HEADER_BYTES, KVSegment

if TYPE_CHECKING:
    from pagedserve.services.worker.runner import ModelRunner


@dataclass(slots=True)
class PoolAttachment:
    epoch: str = ""  # the segment's; "" for a private pool
    segment: KVSegment | None = None

    def close(self) -> None:
        if self.segment is not None:
            self.segment.close()


def attach_pool(
    runner: ModelRunner,
    segment_dir: str | None,
    worker_id: str,
    log: Any,
    locked: tuple[Path, int] | None = None,
) -> PoolAttachment:
    """Size and attach the runner's pool (it was built with defer_pool); raises NameHeld when another
    live process holds this name's segment. `locked`: the name, locked already (kv_segment.lock_name)."""
    runner.pool_sizing = runner.size_pool()  # sized now: a standby's memory reading is from its start
    if segment_dir is None or runner.device.type != "cpu":
        if segment_dir is not None:
            log.warning(
                "kv_segment_ignored", reason=f"no shared-memory pool on {runner.device.type} (design only)"
            )
        runner.attach_pool()
        return PoolAttachment()
    segment = KVSegment.open(
        segment_dir,
        worker_id,
        runner.kv_layout(),
        runner.pool_sizing.num_blocks,
        runner.kv_shape.pool_bytes,
        adopt_num_blocks=runner.pool_sizing.how == "auto",
        locked=locked,
    )
    if segment.discarded is not None:
        # Another model, dtype or block size wrote it (or a worker died setting it up): never trusted.
        log.warning("kv_segment_discarded", path=str(segment.path), reason=segment.discarded)
    runner.attach_pool(segment.memory, HEADER_BYTES, segment.num_blocks)
    log.info(
        "kv_segment_continued" if segment.continued else "kv_segment_created",
        path=str(segment.path),
        epoch=segment.epoch,
        num_blocks=segment.num_blocks,
    )
    return PoolAttachment(segment.epoch, segment)
