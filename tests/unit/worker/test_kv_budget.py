"""The pool sized from the machine: sizes, shares, cgroup limits, the cap, and the refusals at start."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from pagedserve.services.worker.kv_budget import (
    MemoryReading,
    PoolTooSmall,
    check_fits,
    read_available_memory,
    sized_pool,
)
from pagedserve.services.worker.kv_cache import KVCache, KVCacheShape
from pagedserve.shared.config import ServeConfig, parse_bytes

GiB = 1024**3
# SmolLM2-135M in float32: 30 layers x K,V x 3 heads x 64 dims x 4 bytes = 46,080 bytes per token.
SMOLLM2 = KVCacheShape(30, 16, 3, 64, torch.float32)


def auto(reading: MemoryReading, workers: int = 1, max_tokens: int = 64 * 8192, share: float = 0.5):
    return sized_pool(
        SMOLLM2.bytes_per_block,
        16,
        num_blocks=None,
        kv_cache_memory="auto",
        share=share,
        workers_per_machine=workers,
        max_tokens=max_tokens,
        reading=reading,
    )


def test_sizes_are_bytes_or_units_or_auto_and_nonsense_is_refused_naming_the_field():
    assert parse_bytes("auto") == "auto" and parse_bytes(4096) == 4096
    assert (
        parse_bytes("512MiB") == 512 << 20 and parse_bytes("4GiB") == 4 << 30 and parse_bytes("2G") == 2 << 30
    )
    assert ServeConfig(kv_cache_memory="1.5GiB").kv_cache_memory == 3 << 29
    assert ServeConfig().kv_cache_memory == "auto"
    for bad in ("lots", "-1GiB", "4 parsecs", 0):
        with pytest.raises(ValidationError, match="kv_cache_memory"):
            ServeConfig(kv_cache_memory=bad)


def test_auto_takes_the_share_of_available_memory_split_among_the_machines_workers():
    one = auto(MemoryReading(20 * GiB, 24 * GiB, "meminfo"))
    three = auto(MemoryReading(20 * GiB, 24 * GiB, "meminfo"), workers=3)
    assert one.bytes_per_token == 46_080 and one.how == "auto"
    assert one.num_blocks == 10 * GiB // SMOLLM2.bytes_per_block
    assert three.num_blocks == (10 * GiB // 3) // SMOLLM2.bytes_per_block
    # The yardstick: on a 24 GB machine with the weights loaded, 64 requests of 1k tokens fit
    # even with three workers on it.
    assert three.num_tokens >= 64 * 1024
    described = one.describe()
    assert described["kv_tokens"] == one.num_tokens and described["kv_sized_by"] == "auto"
    assert described["memory_source"] == "meminfo"


def test_auto_never_exceeds_what_the_scheduler_could_fill():
    tiny = auto(MemoryReading(20 * GiB, 24 * GiB, "meminfo"), max_tokens=64 * 512)
    assert tiny.num_tokens == 64 * 512 and tiny.capped_at_tokens == 64 * 512


def test_explicit_count_and_budget_are_taken_as_given():
    assert (
        sized_pool(
            1024, 16, num_blocks=7, kv_cache_memory="auto", share=0.5, workers_per_machine=1, max_tokens=1
        ).num_blocks
        == 7
    )
    by_bytes = sized_pool(
        1024,
        16,
        num_blocks=None,
        kv_cache_memory=10 * 1024 + 5,
        share=0.5,
        workers_per_machine=4,
        max_tokens=1,
    )
    assert by_bytes.num_blocks == 10 and by_bytes.how == "kv_cache_memory"
    with pytest.raises(ValueError, match="holds no block"):
        sized_pool(
            1024, 16, num_blocks=None, kv_cache_memory=1000, share=0.5, workers_per_machine=1, max_tokens=1
        )


def test_a_pool_smaller_than_max_model_len_is_refused_naming_the_flags():
    small = sized_pool(
        SMOLLM2.bytes_per_block,
        16,
        num_blocks=None,
        kv_cache_memory=256 << 20,
        share=0.5,
        workers_per_machine=1,
        max_tokens=1,
    )
    with pytest.raises(PoolTooSmall) as info:
        check_fits(small, 8192)
    text = str(info.value)
    assert "5,824 tokens" in text and "max_model_len is 8,192" in text
    assert "--kv-cache-memory" in text and "--max-model-len" in text
    check_fits(small, 4096)  # fits
    # --num-blocks is the testing knob: small pools stay allowed there.
    check_fits(
        sized_pool(
            1024, 16, num_blocks=2, kv_cache_memory="auto", share=0.5, workers_per_machine=1, max_tokens=1
        ),
        8192,
    )


def _fake_machine(tmp: Path, cgroup_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    proc, root = tmp / "proc", tmp / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       25000000 kB\nMemAvailable:   20000000 kB\n")
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return proc, root


def test_a_cgroup_v2_limit_binds_and_its_inactive_page_cache_counts_as_free(tmp_path: Path):
    proc, root = _fake_machine(
        tmp_path,
        "0::/pods/worker",
        {
            "pods/worker/memory.max": str(6 * GiB),
            "pods/worker/memory.current": str(3 * GiB),
            "pods/worker/memory.stat": f"anon {2 * GiB}\ninactive_file {1 * GiB}\n",
            "pods/memory.max": "max",
            "pods/memory.current": str(5 * GiB),
        },
    )
    reading = read_available_memory(proc, root)
    assert reading.available == 4 * GiB and reading.total == 6 * GiB
    assert reading.source.endswith("pods/worker/memory.max")


def test_a_cgroup_v1_limit_of_an_ancestor_binds(tmp_path: Path):
    proc, root = _fake_machine(
        tmp_path,
        "4:memory:/docker/abc",
        {
            "memory/docker/abc/memory.limit_in_bytes": str(1 << 62),  # v1's "no limit"
            "memory/docker/abc/memory.usage_in_bytes": str(1 * GiB),
            "memory/docker/memory.limit_in_bytes": str(3 * GiB),
            "memory/docker/memory.usage_in_bytes": str(1 * GiB),
        },
    )
    assert read_available_memory(proc, root).available == 2 * GiB


def test_without_a_cgroup_limit_meminfo_decides(tmp_path: Path):
    proc, root = _fake_machine(tmp_path, "0::/", {"memory.max": "max", "memory.current": "12"})
    reading = read_available_memory(proc, root)
    assert reading == MemoryReading(20_000_000 * 1024, 25_000_000 * 1024, "meminfo")


def test_a_pool_sized_for_the_machine_costs_nothing_until_written():
    # 2 GiB of KV: the pages come from the machine only as K/V is written, so an auto pool sized for a
    # whole machine starts at once and a worker's RSS shows what it holds, not what it may hold.
    shape = KVCacheShape(4, 16, 4, 64, torch.float32)
    before = _rss()
    cache = KVCache(shape, (2 * GiB) // shape.bytes_per_block, "cpu")
    assert _rss() - before < 64 << 20
    k, v = cache.layers()[-1]
    assert not k[-1].any() and not v[7].any()  # reads as zeros
    k[3].fill_(1.0)
    assert k[3].sum().item() == 16 * 4 * 64 and not cache.k[0][3].any()


def _rss() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def test_int8_kv_holds_3_76x_the_tokens_of_float32_kv_on_smollm2():
    int8 = KVCacheShape(30, 16, 3, 64, torch.int8)
    assert SMOLLM2.bytes_per_block / int8.bytes_per_block == 256 / 68  # 3.76: a float32 scale per 64 values
    assert int8.dims == (16, 3, 68)
