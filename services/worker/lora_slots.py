"""The worker's LoRA adapters: parsed ones on the host in LRU order, active ones in a fixed number of slots.

A step names each row's adapter; `rows_for_step` puts every adapter of the step into a slot (keeping
those already there, evicting the least recently used slot that this step does not need) and returns
each row's slot. A request names its adapter by name *and* path (NewRequest), so a worker that never
saw it -- a fresh one, a restarted one -- loads it from the path before the step that needs it.

On a CPU "host" and "slot" are the same memory: a slot is a set of references from the LoRA linears to
the adapter's tensors, and --max-cpu-loras bounds how many parsed adapters stay cached.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import structlog

from pagedserve.services.worker.layers.lora import LoRABatch, LoRALinear, install_lora_linears
from pagedserve.services.worker.weights.lora_adapter import AdapterError, LoRAAdapter, load_lora_adapter
from pagedserve.shared import failpoints

if TYPE_CHECKING:
    import torch

    from pagedserve.services.worker.models.llama import LlamaForCausalLM

log = structlog.get_logger("pagedserve.lora")


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

    # ------------------------------------------------------------------ host cache

    def load(self, name: str, path: str) -> LoRAAdapter:
        """Parse and check the adapter (AdapterError names what is wrong; nothing changes then) and
        cache it; one already cached from the same path is only touched."""
        adapter = self.cached.get(name)
        if adapter is not None and adapter.path == path:
            self.cached.move_to_end(name)
            return adapter
        started = time.perf_counter()
        adapter = load_lora_adapter(
            name, path, self.model, self.linears, max_rank=self.max_lora_rank, dtype=self.dtype
        )
        failpoints.fire("worker.lora_load")  # parsed, not yet in the cache: chaos kills a worker here
        self.last_load_s = time.perf_counter() - started
        self.num_loads += 1
        self.unload(name)  # a new path under an old name replaces it everywhere
        self.cached[name] = adapter
        while len(self.cached) > self.max_cpu_loras:
            evict = next((n for n in self.cached if n not in self.slots), None)
            if evict is None:
                break
            del self.cached[evict]
        log.info("lora_loaded", name=name, path=path, rank=adapter.rank, seconds=round(self.last_load_s, 4))
        return adapter

    def unload(self, name: str) -> bool:
        """Forget the adapter (its slot empties). -> whether it was held."""
        held = self.cached.pop(name, None) is not None
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
            "last_load_s": self.last_load_s,
        }


__all__ = ["AdapterError", "LoRABatch", "LoRALinear", "LoRASlots"]
