"""The gated MLP (SiLU(gate) * up, then down), gate and up fused into one projection."""

from __future__ import annotations

import torch
from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, LayerOps
from torch import nn


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.ops: LayerOps = TORCH_LAYER_OPS  # the model sets its choice (use_fused_ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(self.ops.silu_and_mul(self.gate_up_proj.forward(x)))
