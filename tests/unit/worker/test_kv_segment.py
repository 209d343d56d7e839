"""A worker's KV segment: continued when its layout is proven, discarded when not, held by one process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pagedserve.services.worker.kv_cache import KVCache, KVCacheShape
from pagedserve.services.worker.kv_segment import HEADER_BYTES, KVSegment, NameHeld

SHAPE = KVCacheShape(num_layers=2, block_size=8, num_kv_heads=2, head_dim=4, dtype=torch.float32)
LAYOUT = {"format": 1, "model": "/models/tiny", "dtype": "float32", "block_size": 8, "num_blocks": 6}


def open_segment(
    folder: Path, layout: dict | None = None, num_blocks: int = 6, adopt: bool = False
) -> KVSegment:
    layout = dict(layout or LAYOUT, num_blocks=num_blocks)
    return KVSegment.open(folder, "worker-0", layout, num_blocks, SHAPE.pool_bytes, adopt_num_blocks=adopt)


def pool_of(segment: KVSegment) -> KVCache:
    return KVCache(SHAPE, segment.num_blocks, "cpu", segment.memory, HEADER_BYTES)


def close(segment: KVSegment, *caches: KVCache) -> None:
    for cache in caches:
        cache.k.clear()
        cache.v.clear()
    segment.close()


def test_a_restarted_worker_continues_the_same_bytes_under_the_same_epoch(tmp_path: Path):
    first = open_segment(tmp_path)
    assert not first.continued and first.discarded is None and first.path.name == "worker-0.kv"
    cache = pool_of(first)
    assert not any(t.any() for t in cache.k + cache.v)  # a fresh segment reads as zeros
    cache.k[1][3].fill_(2.5)
    cache.v[0][5, 7].fill_(-1.0)
    epoch = first.epoch
    close(first, cache)

    again = open_segment(tmp_path)
    assert again.continued and again.epoch == epoch and again.discarded is None
    cache = pool_of(again)
    assert torch.all(cache.k[1][3] == 2.5) and torch.all(cache.v[0][5, 7] == -1.0)
    assert cache.k[0].sum() == 0
    close(again, cache)


def test_a_segment_of_another_layout_is_discarded_with_the_reason_and_starts_from_zero(tmp_path: Path):
    first = open_segment(tmp_path)
    cache = pool_of(first)
    cache.k[0].fill_(9.0)
    close(first, cache)
    other = open_segment(tmp_path, dict(LAYOUT, dtype="bfloat16", block_size=16))
    assert not other.continued and other.epoch != first.epoch
    assert other.discarded is not None
    assert "block_size 8 != 16" in other.discarded and "dtype 'float32' != 'bfloat16'" in other.discarded
    cache = pool_of(other)
    assert cache.k[0].sum() == 0  # never trusted: not one old byte
    close(other, cache)


def test_a_segment_whose_set_up_was_cut_short_is_never_trusted(tmp_path: Path):
    first = open_segment(tmp_path)
    close(first)
    with open(first.path, "r+b") as f:  # as if killed between the body and the magic
        f.write(b"\x00" * 8)
    again = open_segment(tmp_path)
    assert not again.continued and "no complete header" in (again.discarded or "")
    close(again)


def test_an_auto_sized_pool_keeps_the_block_count_it_was_given(tmp_path: Path):
    # The machine's free memory moved (the pool itself now uses some): still the same pool.
    close(open_segment(tmp_path, num_blocks=6, adopt=True))
    again = open_segment(tmp_path, num_blocks=4, adopt=True)
    assert again.continued and again.num_blocks == 6
    close(again)
    explicit = open_segment(tmp_path, num_blocks=4, adopt=False)  # a configured size is a new layout
    assert not explicit.continued and "num_blocks 6 != 4" in (explicit.discarded or "")
    close(explicit)


HOLDER = textwrap.dedent(f"""
    import sys, time
    from pagedserve.services.worker.kv_segment import KVSegment
    layout = {{"format": 1, "model": "/models/tiny", "dtype": "float32", "block_size": 8, "num_blocks": 6}}
    pool_bytes = {SHAPE.pool_bytes(6)}
    segment = KVSegment.open(sys.argv[1], "worker-0", layout, 6, lambda n: pool_bytes, adopt_num_blocks=False)
    print("held", flush=True)
    time.sleep(60)
""")


def test_a_second_live_process_with_the_name_is_refused_with_the_holders_pid_and_a_restart_is_not(
    tmp_path: Path,
):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(NameHeld) as refused:
            open_segment(tmp_path)
        assert f"pid {holder.pid}" in str(refused.value) and "'worker-0'" in str(refused.value)
        # The holder dies however it dies: the kernel drops its lock, and the next one is a restart.
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        restart = open_segment(tmp_path)  # the lock is free the moment its holder dies
        assert restart.continued
        close(restart)
    finally:
        holder.kill()
        holder.wait()
