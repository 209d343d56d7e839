"""The worker's LoRA adapters: parsed ones on the host in LRU order, active ones in a fixed number of slots.

A step names each row's adapter; `rows_for_step` puts every adapter of the step into a slot (keeping
those already there, evicting the least recently used slot that this step does not need) and returns
each row's slot. A request names its adapter by name *and* path (NewRequest), so a worker that never
saw it -- a fresh one, a restarted one -- loads it from the path before the step that needs it.

On a CPU "host" and "slot" are the same memory: a slot is a set of references from the LoRA linears to
the adapter's tensors, and --max-cpu-loras bounds how many parsed adapters stay cached.

A read is not a step's business when it can be helped: the scheduler holds back a request whose adapter
this worker has not read while others run, and asks for the read (Execute.prefetch_loras); it runs on
a reader thread, the adapter joins the cache between steps, and StepResult.loras_ready tells the
scheduler, which then schedules the request. Reading inside a step stays the path of a worker that
had nobody to stall, or that never answered the ask.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import structlog

from pagedserve.services.worker.layers.lora import LoRABatch, LoRALinear, install_lora_linears
from pagedserve.services.worker.weights.lora_adapter import AdapterError, LoRAAdapter, load_lora_adapter
from pagedserve.shared import failpoints

if TYPE_CHECKING:
    import torch

    from pagedserve.services.worker.models.llama import LlamaForCausalLM

log = structlog.get_logger("pagedserve.lora")

# The reader thread's niceness (_yield_to_steps): measured on 2 cores of an AMD EPYC Zen 3, bundled model,
# rank 16, 8 requests decoding (ops/microbench/lora_speed.py): at 0 the steps during a read took 1.65x
# their time before it (the read, 0.05 s); at 19 up to 1.32x, and the read took 1.15-1.39 s; at 10
# 1.09-1.18x, the read 0.25 s.
READER_NICE = 10


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
        # Reads a waiting request asked for (Execute.prefetch_loras), on one reader thread: parsing
        # touches only the files and the model's shapes; the cache changes on the step's thread.
        self.direct_reads = 0  # read by load() itself (at start, or inside a step), not on the reader thread
        self._reader: ThreadPoolExecutor | None = None
        self._reading: dict[tuple[str, str], Future[LoRAAdapter]] = {}
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
        reading = self._reading.pop((name, path), None)
        if reading is None:
            self.direct_reads += 1
            adapter = self._parse(name, path)
        else:
            adapter = reading.result()
        self._keep(adapter)
        return adapter

    def _parse(self, name: str, path: str) -> LoRAAdapter:
        started = time.perf_counter()
        adapter = load_lora_adapter(
            name, path, self.model, self.linears, max_rank=self.max_lora_rank, dtype=self.dtype
        )
        failpoints.fire("worker.lora_load")  # parsed, not yet in the cache: chaos kills a worker here
        self.last_load_s = time.perf_counter() - started
        return adapter

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

    # ------------------------------------------------------------------ read off the step path

    def prefetch(self, name: str, path: str) -> None:
        """Start reading an adapter a waiting request needs on the reader thread (once), so that no
        step carries the read: the running requests' steps go on meanwhile."""
        held = self.cached.get(name)
        key = (name, path)
        if (held is not None and held.path == path) or key in self._reading or key in self.failed:
            return
        if self._reader is None:
            self._reader = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="lora-reader", initializer=_yield_to_steps
            )
        self._reading[key] = self._reader.submit(self._parse, name, path)

    def take_prefetched(self) -> None:
        """Between steps: adapters read in the background join the cache; a failed read is kept as
        failed (a step naming it reads again, and fails the same way, at once)."""
        for key, reading in list(self._reading.items()):
            if not reading.done():
                continue
            del self._reading[key]
            try:
                self._keep(reading.result())
            except Exception as exc:  # noqa: BLE001 - any failure: the step that names it reads again and meets it there
                self.failed[key] = str(exc)
                log.warning("lora_prefetch_failed", name=key[0], path=key[1], error=str(exc))

    def ready(self) -> list[tuple[str, str]]:
        """What a step may name without a read inside it (StepResult.loras_ready)."""
        return [(name, adapter.path) for name, adapter in self.cached.items()] + list(self.failed)

    def unload(self, name: str) -> bool:
        """Forget the adapter (its slot empties; a read of it under way is dropped). -> whether it was held."""
        held = self.cached.pop(name, None) is not None
        for key in [k for k in (*self._reading, *self.failed) if k[0] == name]:
            self._reading.pop(key, None)
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
            "last_load_s": self.last_load_s,
        }


def _yield_to_steps() -> None:
    """The reader thread runs at a lower priority (Linux schedules threads one by one): on a CPU worker
    a step's threads take every core, and a read at equal priority took one of them (READER_NICE)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or not allowed: an equal share
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), READER_NICE)


__all__ = ["AdapterError", "LoRABatch", "LoRALinear", "LoRASlots"]
