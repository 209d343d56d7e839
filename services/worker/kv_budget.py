"""How many KV blocks a worker's pool gets: from an explicit count, a byte budget, or the machine.

`kv_cache_memory: auto` (the default) takes `kv_cache_share` of the memory that is available once
the weights are loaded, divides it among the workers of the machine (`workers_per_machine`), and
caps it at what the scheduler could ever fill (`max_num_seqs` requests at `max_model_len` each:
more would only be prefix cache nobody can reach). Available memory is the least of the kernel's
MemAvailable and, for every cgroup from ours up to the root, its `memory.max` minus its
`memory.current` (cgroup v2; v1's limit and usage files likewise): a container's limit is the
limit, not the host's free memory.

Pure arithmetic apart from `read_available_memory`, so tests drive it with made-up readings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_MiB = 1024**2


@dataclass(frozen=True, slots=True)
class MemoryReading:
    available: int  # bytes this process may still take
    total: int  # bytes of the machine or of the tightest cgroup limit
    source: str  # "meminfo" or the cgroup file that bound it, for the start log


@dataclass(frozen=True, slots=True)
class PoolSizing:
    """The pool chosen and why: what the start log says and a refusal quotes."""

    num_blocks: int
    block_size: int
    bytes_per_token: int
    how: str  # "num_blocks", "kv_cache_memory" or "auto"
    budget_bytes: int | None = None  # the bytes it was sized from (None for an explicit count)
    capped_at_tokens: int | None = None  # auto: the cap that bound it, when one did
    memory: MemoryReading | None = None  # auto: what the machine said
    share: float | None = None  # auto: of the available memory, over all workers_per_machine
    workers_per_machine: int = 1

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def pool_bytes(self) -> int:
        return self.num_tokens * self.bytes_per_token

    def describe(self) -> dict[str, object]:
        """The start log's fields."""
        facts: dict[str, object] = {
            "kv_sized_by": self.how,
            "kv_blocks": self.num_blocks,
            "kv_tokens": self.num_tokens,
            "kv_bytes_per_token": self.bytes_per_token,
            "kv_pool_mib": round(self.pool_bytes / _MiB, 1),
        }
        if self.budget_bytes is not None:
            facts["kv_budget_mib"] = round(self.budget_bytes / _MiB, 1)
        if self.capped_at_tokens is not None:
            facts["kv_capped_at_tokens"] = self.capped_at_tokens
        if self.memory is not None:
            facts["memory_available_mib"] = round(self.memory.available / _MiB, 1)
            facts["memory_source"] = self.memory.source
            facts["kv_share"] = f"{self.share} / {self.workers_per_machine} worker(s)"
        return facts


class PoolTooSmall(ValueError):
    """The pool cannot hold one request of max_model_len: refused at start, naming the flags."""


def sized_pool(
    bytes_per_block: int,
    block_size: int,
    *,
    num_blocks: int | None,
    kv_cache_memory: int | str,
    share: float,
    workers_per_machine: int,
    max_tokens: int,
    reading: MemoryReading | None = None,
) -> PoolSizing:
    """The pool for one worker. `max_tokens`: the most it could ever hold at once (the auto cap)."""
    per_token = bytes_per_block // block_size
    if num_blocks is not None:
        return PoolSizing(num_blocks, block_size, per_token, "num_blocks")
    if kv_cache_memory != "auto":
        budget = int(kv_cache_memory)
        return PoolSizing(
            blocks_in(budget, bytes_per_block, block_size), block_size, per_token, "kv_cache_memory", budget
        )
    reading = reading if reading is not None else read_available_memory()
    budget = int(reading.available * share / workers_per_machine)
    cap = -(-max_tokens // block_size)
    capped = budget // bytes_per_block > cap
    return PoolSizing(
        cap if capped else blocks_in(budget, bytes_per_block, block_size),
        block_size,
        per_token,
        "auto",
        budget,
        max_tokens if capped else None,
        reading,
        share,
        workers_per_machine,
    )


def blocks_in(budget_bytes: int, bytes_per_block: int, block_size: int) -> int:
    num_blocks = budget_bytes // bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"a KV budget of {budget_bytes} bytes holds no block: one block of {block_size} tokens "
            f"needs {bytes_per_block} bytes"
        )
    return num_blocks


def check_fits(sizing: PoolSizing, max_model_len: int) -> None:
    """A pool that cannot hold one request of max_model_len would refuse (or preempt forever) every
    long request: say so at start, with the flag to change. An explicit --num-blocks is the testing
    knob and is left alone (requests too big for it are refused one by one, with the numbers)."""
    if sizing.how == "num_blocks" or sizing.num_tokens >= max_model_len:
        return
    need = -(-max_model_len // sizing.block_size) * sizing.block_size * sizing.bytes_per_token
    raise PoolTooSmall(
        f"the KV pool holds {sizing.num_tokens:,} tokens ({sizing.num_blocks:,} blocks of {sizing.block_size}, "
        f"{sizing.bytes_per_token:,} bytes per token, sized by {sizing.how}"
        + (f" from {sizing.budget_bytes / _MiB:,.0f} MiB" if sizing.budget_bytes is not None else "")
        + f") but max_model_len is {max_model_len:,}: give it at least {need / _MiB:,.0f} MiB "
        f"(--kv-cache-memory {need}, or a larger --kv-cache-share with auto), or lower "
        f"--max-model-len to {sizing.num_tokens:,} or less"
    )


# ---------------------------------------------------------------- reading the machine


def read_available_memory(
    proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> MemoryReading:
    meminfo = _meminfo(proc / "meminfo")
    best = MemoryReading(
        meminfo.get("MemAvailable", meminfo.get("MemFree", 0)), meminfo.get("MemTotal", 0), "meminfo"
    )
    for limit_file, usage_file in _cgroup_files(proc / "self" / "cgroup", cgroup_root):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is None or usage is None or limit >= 1 << 60:  # "max", or v1's "no limit" sentinel
            continue
        # Usage counts the page cache, which the kernel reclaims before it fails an allocation; its
        # inactive part is what MemAvailable would count as available too.
        stat = _meminfo(limit_file.parent / "memory.stat")
        reclaimable = stat.get("inactive_file", stat.get("total_inactive_file", 0))
        left = max(0, limit - max(0, usage - reclaimable))
        if left < best.available:
            best = MemoryReading(left, limit, str(limit_file))
    return best


def _meminfo(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            name, colon, rest = line.partition(":")
            if not colon:  # memory.stat: "name value"
                name, _, rest = line.partition(" ")
            parts = rest.split()
            if parts:
                out[name] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    except OSError:
        pass
    return out


def _cgroup_files(self_cgroup: Path, root: Path) -> list[tuple[Path, Path]]:
    """(limit, usage) files of our cgroup and each of its ancestors, v2 and v1."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return []
    found: list[tuple[Path, Path]] = []
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: "0::/the/path"
            base, names = root, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, names = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            folder = base.joinpath(*parts[:depth])
            found.append((folder / names[0], folder / names[1]))
    return found


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
