"""LoRA-aware linears: any linear kind (nn.Linear, PackedLinear, QuantLinear, a fused q/k/v or gate/up)
plus, per row, the delta of that row's adapter.

Adapters sit in a fixed number of slots (--max-loras). Each LoRA linear keeps all slots stacked, per
part of its output (q, k, v of a fused q/k/v; gate, up; one part otherwise), padded to one rank R:
    a      [slots, parts, R, in]       every part's A, zero rows past that part's rank
    b[p]   [slots, R, out of part p]   part p's B^T, scaled, zero rows past its rank
Zero padding adds exact zeros, so a rank-8 part next to a rank-16 one is still exact. Filling a slot
copies one adapter into its place (weights/lora_adapter.py packs it); nothing else moves.

A step's rows belong to several adapters and to none. The runner gives the shared `LoRABatch` each
row's slot once per step, and every LoRA linear then takes one of three paths:
- float32 activations (stacks float32, or bfloat16 / float16 by --lora-dtype), up to `CPP_MAX_ROWS`
  adapter rows or `CPP_ROWS_PER_ADAPTER` per adapter, where the C++ kernels build: one call of our
  kernel (kernels/cpu/lora.cpp): rows grouped by slot, each slot's A and B read once, no wasted
  multiplies.
- few rows (decode of a small batch) otherwise: every row against every slot in use, punica/BGMV-style but
  without a per-row gather: `xa = x a^T` over all slots in one GEMM, rows times a 0/1 mask of their
  slot (one mask per step, shared by all linears), then one GEMM per part with that part's stacked B.
  Three or four calls per linear however many adapters; the waste is rows x slots x R multiplies.
- many rows (prefills, big batches): per adapter, its rows (a slice when the runner grouped them,
  else an index) times that slot's A and B: two GEMMs per adapter and part, no wasted work.
The crossovers (`CPP_MAX_ROWS`, `CPP_ROWS_PER_ADAPTER`, `MASKED_MAX_ROW_SLOTS`) were measured on the
bundled model's shapes (docs/lora.md, `ops/microbench/lora_linear_ab.py`).
A step without adapter rows costs one Python call and an empty check per linear. Where a decoder
layer runs as one C++ call (fused_layer.py), that op calls the same kernel for its adapted linears.

MoE expert weights are not adapted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from pagedserve.services.worker.models.llama import LlamaForCausalLM
    from pagedserve.services.worker.weights.lora_adapter import PackedLoRA

# Masked path while rows x slots in use <= this: at 8 rows over 4 adapters it took half the time of
# the grouped GEMMs; at 64 rows over 8 it took ~1.5x (SmolLM2-135M shapes, rank 16, Zen 4, 2 threads).
MASKED_MAX_ROW_SLOTS = 128
# The C++ kernel up to this many adapter rows in a step, or up to CPP_ROWS_PER_ADAPTER per adapter in it;
# past both the grouped GEMMs (long prefills of few adapters). us a layer at 2 threads, Zen 3, kernel vs
# grouped: 128 rows of 1 adapter 672 / 578, 256 of 4 1232-1297 / 1450-2996, 512 of 4 2503-2700 /
# 4406-5260, 1024 of 8 6915 / 10633, 256 of 1 1295 / 845, 512 of 2 2594 / 1938.
CPP_MAX_ROWS = 128
CPP_ROWS_PER_ADAPTER = 64


@functools.cache
def cpp_lora_delta():
    """The C++ kernel's op on this CPU's best path, or None where it does not build (logged once)."""
    from pagedserve.kernels.cpu.build import LORA
    from pagedserve.kernels.cpu.dispatch import try_load_ops

    ops = try_load_ops(LORA)
    return None if ops is None else ops.lora_delta_.default


@dataclass(slots=True)
class LoRABatch:
    """This step's rows per adapter slot.

    groups: (slot, rows) per adapter in the step, rows a slice or an int64 index tensor.
    mask: [rows, slots in use, 1, 1], 1.0 where the row belongs to the slot; None: take `groups`.
    row_slots: each row's slot (int64, -1 for the base) when the C++ kernel takes the step's float32
    linears; None: the torch paths. `cpp` False keeps every step on the torch paths (tests, A/B).
    """

    groups: list[tuple[int, slice | torch.Tensor]] = field(default_factory=list)
    mask: torch.Tensor | None = None
    masks: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)  # `mask` per dtype seen
    row_slots: torch.Tensor | None = None
    cpp: bool = True
    # Bumped whenever a linear's stacks are replaced by bigger ones: a fused layer holds the old ones.
    version: int = 0

    def set_rows(self, row_slots: list[int]) -> None:
        """row_slots[i]: the slot of packed row i, -1 for the base model."""
        self.groups = group_rows(row_slots)
        self.masks = {}
        # The crossover counts the rows the delta works on: the kernel and the GEMMs skip base rows, so a
        # base prefill beside a few adapter decodes keeps the kernel.
        adapter_rows = len(row_slots) - row_slots.count(-1)
        most_rows = max(CPP_MAX_ROWS, CPP_ROWS_PER_ADAPTER * len(self.groups))
        use_cpp = self.cpp and self.groups and adapter_rows <= most_rows and cpp_lora_delta() is not None
        self.row_slots = torch.tensor(row_slots, dtype=torch.int64) if use_cpp else None
        in_use = max(row_slots, default=-1) + 1
        if not self.groups or len(row_slots) * in_use > MASKED_MAX_ROW_SLOTS:
            self.mask = None
            return
        mask = torch.zeros(len(row_slots), in_use)
        rows = [row for row, slot in enumerate(row_slots) if slot >= 0]
        mask[rows, [row_slots[row] for row in rows]] = 1.0
        self.mask = mask.view(len(row_slots), in_use, 1, 1)

    def clear(self) -> None:
        self.groups, self.mask, self.masks, self.row_slots = [], None, {}, None

    def mask_in(self, dtype: torch.dtype) -> torch.Tensor:
        mask = self.masks.get(dtype)
        if mask is None:
            assert self.mask is not None
            mask = self.masks[dtype] = self.mask.to(dtype)
        return mask


def group_rows(row_slots: list[int]) -> list[tuple[int, slice | torch.Tensor]]:
    by_slot: dict[int, list[int]] = {}
    for row, slot in enumerate(row_slots):
        if slot >= 0:
            by_slot.setdefault(slot, []).append(row)
    groups: list[tuple[int, slice | torch.Tensor]] = []
    for slot, rows in by_slot.items():
        if rows[-1] - rows[0] + 1 == len(rows):
            groups.append((slot, slice(rows[0], rows[-1] + 1)))
        else:
            groups.append((slot, torch.tensor(rows, dtype=torch.int64)))
    return groups


class LoRALinear(nn.Module):
    """`base` plus the adapter delta of each row's slot; `out_features` / `in_features` are the base's.

    parts: the output rows of each part of a fused base (q, k, v), in order; one part when not fused.
    """

    def __init__(
        self, base: nn.Module, batch: LoRABatch, num_slots: int, parts: list[slice] | None = None
    ) -> None:
        super().__init__()
        self.base = base
        in_features, out_features = base.in_features, base.out_features
        assert isinstance(in_features, int) and isinstance(out_features, int)  # every linear kind's are
        self.in_features, self.out_features = in_features, out_features
        self.batch = batch  # shared by every LoRA linear of the model; the runner sets it per step
        self.parts = parts or [slice(0, self.out_features)]
        self.num_slots = num_slots
        self.filled = [False] * num_slots  # whether the slot's adapter targets this linear
        self.rank = 0  # R: the largest part rank filled so far (the stacks grow, never shrink)
        self.a = torch.zeros(0)
        self.b: list[torch.Tensor] = []

    # ------------------------------------------------------------------ slots

    @torch.inference_mode()  # the stacks are made in steps (inference tensors) and changed by loads
    def fill(self, slot: int, packed: PackedLoRA | None) -> None:
        """Put one adapter's weights for this linear into `slot` (None: empty it)."""
        if packed is None:
            if self.filled[slot]:
                self.a[slot].zero_()
                for b in self.b:
                    b[slot].zero_()
            self.filled[slot] = False
            return
        rank = max(a.shape[0] for _, a, _ in packed.parts)
        if rank > self.rank or not self.b:
            self._grow(rank, packed.parts[0][1].dtype)
        # Each byte of the slot written once (a hot load fills ~20 MB inside a step): the adapter's
        # rows copied, only the padding past its rank and the parts it leaves out zeroed.
        given = {part: (a, bt) for part, a, bt in packed.parts}
        for part in range(len(self.parts)):
            r = 0
            if part in given:
                a, bt = given[part]
                r = a.shape[0]
                self.a[slot, part, :r].copy_(a)
                self.b[part][slot, :r].copy_(bt)
            if r < self.rank:
                self.a[slot, part, r:].zero_()
                self.b[part][slot, r:].zero_()
        self.filled[slot] = True

    def _grow(self, rank: int, dtype: torch.dtype) -> None:
        rank = max(rank, self.rank)
        a = torch.zeros(self.num_slots, len(self.parts), rank, self.in_features, dtype=dtype)
        b = [torch.zeros(self.num_slots, rank, p.stop - p.start, dtype=dtype) for p in self.parts]
        if self.b:
            a[:, :, : self.rank].copy_(self.a)
            for new, old in zip(b, self.b, strict=True):
                new[:, : self.rank].copy_(old)
        self.a, self.b, self.rank = a, b, rank
        self.batch.version += 1

    # ------------------------------------------------------------------ one step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base.forward(x)
        batch = self.batch
        if not batch.groups or not self.rank:
            return out
        # The kernel takes float32, bfloat16 or float16 stacks (--lora-dtype), widening half ones as it
        # loads them; the torch paths below cast a stack to x's dtype per call (a no-op when they agree).
        if batch.row_slots is not None and x.dtype == out.dtype == torch.float32:
            op = cpp_lora_delta()
            assert op is not None  # set_rows sets row_slots only where it loaded
            op(out, x, self.a, self.b, batch.row_slots)  # x's and out's rows contiguous: checked there
            return out
        if batch.mask is not None:
            return self._masked(x, out, batch.mask_in(x.dtype))
        parts, rank = self.parts, self.rank
        for slot, rows in batch.groups:
            if not self.filled[slot]:  # this adapter does not target this linear
                continue
            xa = torch.mm(
                x[rows] if type(rows) is slice else x.index_select(0, rows),
                self.a[slot].flatten(0, 1).t().to(x.dtype),
            )
            if type(rows) is slice:
                target = out[rows]
            else:
                target = torch.zeros(xa.shape[0], self.out_features, dtype=out.dtype)
            if len(parts) == 1:
                target.addmm_(xa, self.b[0][slot].to(x.dtype))
            else:
                for p, cols in enumerate(parts):
                    target[:, cols].addmm_(xa[:, p * rank : (p + 1) * rank], self.b[p][slot].to(x.dtype))
            if type(rows) is not slice:
                out.index_add_(0, rows, target)
        return out

    def _masked(self, x: torch.Tensor, out: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Every row against every slot in use (mask: [rows, slots, 1, 1]), each row's own kept."""
        rows, slots = mask.shape[0], mask.shape[1]
        parts, rank = self.parts, self.rank
        xa = torch.mm(x, self.a[:slots].view(slots * len(parts) * rank, self.in_features).t().to(x.dtype))
        per_part = xa.view(rows, slots, len(parts), rank).mul_(mask)
        if len(parts) == 1:
            return out.addmm_(xa, self.b[0][:slots].view(slots * rank, -1).to(x.dtype))
        for p, cols in enumerate(parts):
            out[:, cols].addmm_(
                per_part[:, :, p].reshape(rows, slots * rank),
                self.b[p][:slots].view(slots * rank, -1).to(x.dtype),
            )
        return out

    def extra_repr(self) -> str:
        used = sum(self.filled)
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, parts={len(self.parts)}, "
            f"rank={self.rank}, slots={used}/{self.num_slots}"
        )


# The projections a LoRA adapter may target, by their attribute path inside a decoder layer.
LORA_TARGETS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def fused_parts(model: LlamaForCausalLM, fused: str, out_features: int) -> list[slice]:
    """The output rows of each checkpoint projection fused into `fused` (q/k/v, gate/up), in order."""
    shards = sorted(s for f, s in getattr(model, "fused_projections", {}).values() if f == fused)
    if not shards:
        return [slice(0, out_features)]
    parts = [model._shard_rows(fused, shard) for shard in shards]
    if parts[-1].stop != out_features:  # a block whose size is not the config's: one part
        return [slice(0, out_features)]
    return parts


def install_lora_linears(model: LlamaForCausalLM, num_slots: int) -> tuple[LoRABatch, dict[str, LoRALinear]]:
    """Wrap every adaptable projection of `model.layers` (after any prepacking or quantizing);
    -> (the batch they share, module path -> LoRA linear)."""
    batch = LoRABatch()
    linears: dict[str, LoRALinear] = {}
    for index, layer in enumerate(model.layers):
        for target in LORA_TARGETS:
            parent_name, attr = target.rsplit(".", 1)
            parent = layer.get_submodule(parent_name)
            base = getattr(parent, attr, None)
            if base is None or isinstance(base, LoRALinear) or not hasattr(base, "out_features"):
                continue
            wrapped = LoRALinear(base, batch, num_slots, fused_parts(model, attr, base.out_features))
            setattr(parent, attr, wrapped)
            linears[f"layers.{index}.{target}"] = wrapped
    model.lora = batch
    model.fused_layers = None  # the layers' linears changed: decided again at the next forward
    return batch, linears
