"""The worker's LoRA adapters: parsed ones on the host in LRU order, active ones in a fixed number of slots.

A step names each row's adapter; `rows_for_step` puts every adapter of the step into a slot (keeping
those already there, evicting the least recently used slot that this step does not need) and returns
each row's slot. A request names its adapter by name *and* path (NewRequest), so a worker that never
saw it -- a fresh one, a restarted one -- loads it from the path before the step that needs it.

On a CPU "host" and "slot" are the same memory: a slot is a set of references from the LoRA linears to
the adapter's tensors, and --max-cpu-loras bounds how many parsed adapters stay cached.

A read is not a step's business when it can be helped: the scheduler holds back a request whose adapter
this worker has not read while others run, and asks for the read (Execute.prefetch_loras). The read
goes on in slices between steps, each slice a small share of the last step's time (READ_SHARE), so the
running requests' steps grow by that share and no more; the adapter joins the cache when its last
slice is done, and StepResult.loras_ready tells the scheduler, which then schedules the request.
Reading inside a step stays the path of a worker that had nobody to stall, or that never answered the
ask.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import structlog

from pagedserve.services.worker.layers.lora import LoRABatch, LoRALinear, install_lora_linears
from pagedserve.services.worker.weights.lora_adapter import (
    AdapterError,
    AdapterRead,
    LoRAAdapter,
    finish_read,
    read_lora_adapter,
)

if TYPE_CHECKING:
    import torch

    from pagedserve.services.worker.models.llama import LlamaForCausalLM

log = structlog.get_logger("pagedserve.lora")

# A read's slices between steps: this share of the last step's time, and at least MIN_READ_SLICE_S (a
# read goes on however short the steps). Until Dec 2026 the read ran whole on a thread at nice 10; on a
# CPU worker every core is the step's, and the steps during a read ran 1.0-1.3x their time before it
# (AMD EPYC Zen 3, 2 cores, bundled model, rank 16, 8 requests decoding: a read is ~25 ms of one core).
READ_SHARE = 0.06
MIN_READ_SLICE_S = 0.002


class LoRASlots:
    def __init__(
        self,
        model: LlamaForCausalLM,
        *,
        max_loras: int,
        max_lora_rank: int,
        max_cpu_loras: int,
        dtype: torch.dtype,
    ) -> None:
        self.model = model
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max(max_cpu_loras, max_loras)
        self.dtype = dtype
        self.batch, self.linears = install_lora_linears(model, max_loras)
        self.cached: OrderedDict[str, LoRAAdapter] = OrderedDict()  # least recently used first
        self.slots: list[str | None] = [None] * max_loras
        self.slot_used: list[int] = [0] * max_loras  # the step that last used each slot (LRU)
        self._loaded: dict[int, LoRAAdapter] = {}  # slot -> the adapter object its linears reference
        self.num_loads = 0
        self.last_load_s = 0.0
        # Reads a waiting request asked for (Execute.prefetch_loras), oldest first, and when each began.
        self.direct_reads = 0  # read by load() itself (at start, or inside a step), not between steps
        self._reading: dict[tuple[str, str], tuple[AdapterRead, float]] = {}
        self.failed: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------------ host cache

    def load(self, name: str, path: str) -> LoRAAdapter:
        """Parse and check the adapter (AdapterError names what is wrong; nothing changes then) and
        cache it; one already cached from the same path is only touched, one being read in the
        background is waited for."""
        adapter = self.cached.get(name)
        if adapter is not None and adapter.path == path:
            self.cached.move_to_end(name)
            return adapter
        self.failed.pop((name, path), None)
        started = time.perf_counter()
        reading = self._reading.pop((name, path), None)
        if reading is None:
            self.direct_reads += 1
            read = self._read(name, path)
        else:  # the rest of a read under way, at once
            read, started = reading
        adapter = finish_read(read)
        self.last_load_s = time.perf_counter() - started
        self._keep(adapter)
        return adapter

    def read_for_step(self, wanted: set[tuple[str, str | None]]) -> tuple[set[tuple[str, str | None]], float]:
        """Before a step: read every adapter it names that is not cached (a worker with nobody running
        was sent the request without a read beside the steps). -> (the (name, path) whose read failed,
        the seconds the reads took). Each failure is kept until take_failures reports it, and the step
        leaves its requests out rather than failing whole."""
        unreadable = set()
        read_s = 0.0
        for name, path in wanted:
            adapter = self.cached.get(name)
            if path is None or (adapter is not None and adapter.path == path):
                continue  # cached (or named without a path: rows_for_step says what is wrong)
            try:
                self.load(name, path)
                read_s += self.last_load_s
            except Exception as exc:  # noqa: BLE001 - any failure: the scheduler ends the requests that name it
                self.failed[(name, path)] = str(exc)
                log.warning("lora_read_failed_in_step", name=name, path=path, error=str(exc))
                unreadable.add((name, path))
        return unreadable, read_s

    def _keep(self, adapter: LoRAAdapter) -> None:
        self.num_loads += 1
        self.unload(adapter.name)  # a new path under an old name replaces it everywhere
        self.cached[adapter.name] = adapter
        while len(self.cached) > self.max_cpu_loras:
            evict = next((n for n in self.cached if n not in self.slots), None)
            if evict is None:
                break
            del self.cached[evict]
        log.info(
            "lora_loaded",
            name=adapter.name,
            path=adapter.path,
            rank=adapter.rank,
            seconds=round(self.last_load_s, 4),
        )

    # ------------------------------------------------------------------ read between steps

    def prefetch(self, name: str, path: str) -> None:
        """Begin reading an adapter a waiting request needs (once); take_prefetched carries it on."""
        held = self.cached.get(name)
        key = (name, path)
        if (held is not None and held.path == path) or key in self._reading or key in self.failed:
            return
        self._reading[key] = (self._read(name, path), time.perf_counter())

    def _read(self, name: str, path: str) -> AdapterRead:
        return read_lora_adapter(
            name, path, self.model, self.linears, max_rank=self.max_lora_rank, dtype=self.dtype
        )

    def take_prefetched(self, last_step_s: float) -> None:
        """Between steps: carry the reads under way on, oldest first, for READ_SHARE of the last step's
        time (at least MIN_READ_SLICE_S, and at least one slice); a finished read joins the cache, a
        failed one is kept as failed until take_failures reports it."""
        if not self._reading:
            return
        now = time.perf_counter()
        deadline = now + max(MIN_READ_SLICE_S, READ_SHARE * last_step_s)
        while self._reading:
            key = next(iter(self._reading))
            read, started = self._reading[key]
            try:
                next(read)
            except StopIteration as done:
                del self._reading[key]
                self.last_load_s = time.perf_counter() - started
                self._keep(done.value)
            except Exception as exc:  # noqa: BLE001 - any failure: the scheduler ends the requests that wait on it
                del self._reading[key]
                self.failed[key] = str(exc)
                log.warning("lora_prefetch_failed", name=key[0], path=key[1], error=str(exc))
            if time.perf_counter() >= deadline:
                return

    def ready(self) -> list[tuple[str, str]]:
        """What a step may name without a read inside it (StepResult.loras_ready)."""
        return [(name, adapter.path) for name, adapter in self.cached.items()]

    def take_failures(self) -> list[tuple[str, str, str]]:
        """The reads asked for that failed, each reported once (StepResult.loras_failed): a later ask
        reads the files again (they may have been mended)."""
        failures = [(name, path, error) for (name, path), error in self.failed.items()]
        self.failed.clear()
        return failures

    def unload(self, name: str) -> bool:
        """Forget the adapter (its slot empties; a read of it under way is dropped). -> whether it was held."""
        held = self.cached.pop(name, None) is not None
        for key in [k for k in (*self._reading, *self.failed) if k[0] == name]:
            reading = self._reading.pop(key, None)
            if reading is not None:
                reading[0].close()  # its file closed now, not when collected
            self.failed.pop(key, None)
        for slot, occupant in enumerate(self.slots):
            if occupant == name:
                self._fill(slot, None)
        return held

    # ------------------------------------------------------------------ one step

    def rows_for_step(self, step: int, rows: list[tuple[str | None, str | None, int]]) -> float:
        """rows: per scheduled request (adapter name or None, its path, its rows this step), in packed
        order. Loads and slots what is missing, then tells the LoRA linears each row's slot.
        -> seconds spent loading adapters from disk in this step (0.0 nearly always)."""
        wanted = {name: path for name, path, _ in rows if name is not None}
        if not wanted:
            self.batch.clear()
            return 0.0
        if len(wanted) > self.max_loras:
            raise AdapterError(
                f"step {step} uses {len(wanted)} LoRA adapters; this worker has {self.max_loras} slots (--max-loras)"
            )
        slot_of = {}
        loads_before, load_s = self.num_loads, 0.0
        for name, path in wanted.items():
            if path is None and name not in self.cached:
                raise AdapterError(f"step {step}: LoRA adapter {name!r} is not loaded here and has no path")
            adapter = self.load(name, path) if path is not None else self.cached[name]
            if self.num_loads != loads_before:
                load_s, loads_before = load_s + self.last_load_s, self.num_loads
            slot_of[name] = self._slot_for(adapter, wanted)
            self.slot_used[slot_of[name]] = step
        row_slots: list[int] = []
        for name, _path, count in rows:
            row_slots.extend([-1 if name is None else slot_of[name]] * count)
        self.batch.set_rows(row_slots)
        return load_s

    def _slot_for(self, adapter: LoRAAdapter, wanted: dict[str, str | None]) -> int:
        if adapter.name in self.slots:
            slot = self.slots.index(adapter.name)
            if self.linears_hold(slot, adapter):
                return slot
        free = [i for i, occupant in enumerate(self.slots) if occupant is None or occupant not in wanted]
        slot = min(free, key=lambda i: (self.slots[i] is not None, self.slot_used[i]))
        self._fill(slot, adapter)
        return slot

    def linears_hold(self, slot: int, adapter: LoRAAdapter) -> bool:
        """Whether the slot holds this very adapter object (not an older load of the same name)."""
        return self._loaded.get(slot) is adapter

    def _fill(self, slot: int, adapter: LoRAAdapter | None) -> None:
        for path, linear in self.linears.items():
            packed = None if adapter is None else adapter.modules.get(path)
            linear.fill(slot, packed)
        self.slots[slot] = None if adapter is None else adapter.name
        if adapter is None:
            self._loaded.pop(slot, None)
        else:
            self._loaded[slot] = adapter

    def stats(self) -> dict[str, object]:
        return {
            "slots": [s for s in self.slots if s is not None],
            "cached": list(self.cached),
            "loads": self.num_loads,
            "direct_reads": self.direct_reads,
            "reading": [name for name, _path in self._reading],
            "last_load_s": self.last_load_s,
        }


__all__ = ["AdapterError", "LoRABatch", "LoRALinear", "LoRASlots"]
