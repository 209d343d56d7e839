"""LoRA-aware linears: any linear kind (nn.Linear, PackedLinear, QuantLinear, a fused q/k/v or gate/up)
plus, per row, the delta of that row's adapter.

A step's rows belong to several adapters and to none. The runner groups them once per step
(`LoRABatch`: per adapter slot, its rows as a slice when contiguous, else an index tensor), and every
LoRA linear then runs one small GEMM pair per adapter present:
    y = base(x);  y[rows] += (x[rows] A_s^T) B_s^T
with the scale folded into B and a fused linear's parts packed into one A and one block-diagonal B
(weights/lora_adapter.py). A step without adapter rows costs one Python call and an empty check.

Why grouped and not gathered per row (punica's BGMV): gathering each row's A and B is rows x rank x
(in + out) copied per linear per step; grouping copies only x's rows, and with few adapters per step
(the scheduler caps them at --max-loras) the GEMMs are few. Measured in docs/lora.md.

Adapters sit in a fixed number of slots (--max-loras): each LoRA linear holds one (A, B) pair or None
per slot, so loading an adapter into a slot is pointer assignments, never a copy into a big buffer.
MoE expert weights are not adapted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(slots=True)
class LoRABatch:
    """This step's rows per adapter slot: (slot, rows) with rows a slice or an int64 index tensor."""

    groups: list[tuple[int, slice | torch.Tensor]] = field(default_factory=list)

    def set_rows(self, row_slots: list[int]) -> None:
        """row_slots[i]: the slot of packed row i, -1 for the base model."""
        self.groups = group_rows(row_slots)


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
    """`base` plus the adapter delta of each row's slot; `out_features` / `in_features` are the base's."""

    def __init__(self, base: nn.Module, batch: LoRABatch, num_slots: int) -> None:
        super().__init__()
        self.base = base
        in_features, out_features = base.in_features, base.out_features
        assert isinstance(in_features, int) and isinstance(out_features, int)  # every linear kind's are
        self.in_features, self.out_features = in_features, out_features
        self.batch = batch  # shared by every LoRA linear of the model; the runner sets it per step
        self.slots: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_slots

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base.forward(x)
        groups = self.batch.groups
        if not groups:
            return out
        slots = self.slots
        for slot, rows in groups:
            weights = slots[slot]
            if weights is None:  # this adapter does not target this linear
                continue
            a, b = weights
            if type(rows) is slice:
                out[rows].addmm_(torch.mm(x[rows], a.t()), b.t())
            else:
                out.index_add_(0, rows, torch.mm(torch.mm(x.index_select(0, rows), a.t()), b.t()))
        return out

    def extra_repr(self) -> str:
        used = sum(s is not None for s in self.slots)
        return f"in_features={self.in_features}, out_features={self.out_features}, slots={used}/{len(self.slots)}"


# The projections a LoRA adapter may target, by their attribute path inside a decoder layer.
LORA_TARGETS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def install_lora_linears(model: nn.Module, num_slots: int) -> tuple[LoRABatch, dict[str, LoRALinear]]:
    """Wrap every adaptable projection of `model.layers` (after any prepacking or quantizing);
    -> (the batch they share, module path -> LoRA linear)."""
    batch = LoRABatch()
    linears: dict[str, LoRALinear] = {}
    for index, layer in enumerate(model.layers):  # type: ignore[attr-defined]
        for target in LORA_TARGETS:
            parent_name, attr = target.rsplit(".", 1)
            parent = layer.get_submodule(parent_name)
            base = getattr(parent, attr, None)
            if base is None or isinstance(base, LoRALinear) or not hasattr(base, "out_features"):
                continue
            wrapped = LoRALinear(base, batch, num_slots)
            setattr(parent, attr, wrapped)
            linears[f"layers.{index}.{target}"] = wrapped
    return batch, linears
