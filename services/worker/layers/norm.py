"""RMSNorm, and the residual add fused into it (one C++ kernel on the CPU)."""

from __future__ import annotations

import torch
from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, LayerOps
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops: LayerOps = TORCH_LAYER_OPS  # the model sets its choice (use_fused_ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (norm(x + residual), x + residual); may overwrite both inputs (the fused op does)."""
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)
