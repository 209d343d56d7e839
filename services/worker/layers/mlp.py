"""The gated MLP (SiLU(gate) * up, then down), gate and up fused into one projection."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, LayerOps
from torch import nn

if TYPE_CHECKING:
    from pagedserve.services.worker.models.registry import ModelConfig


class GatedMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.ops: LayerOps = TORCH_LAYER_OPS  # the model sets its choice (use_fused_ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(self.ops.silu_and_mul(self.gate_up_proj.forward(x)))
