"""RMSNorm, and the residual add fused into it (one C++ kernel on the CPU).

Gemma's norms multiply by 1 + w where Llama's multiply by w; its checkpoints store w. The loader fills
w, then `fold_unit_offset` adds the 1 once. In float32 the folded weight is the very value transformers
computes (`1.0 + weight.float()`) and the norm runs the shared kernels. In a 16-bit dtype Gemma also
rounds differently from Llama: transformers multiplies by 1 + w in float32 and rounds once, where Llama
rounds the normalised x before the multiply. A 16-bit Gemma norm therefore runs that float32 formula in
torch ops (with 1 + w kept in float32), not the shared kernels.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, LayerOps


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, *, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.unit_offset = unit_offset  # the checkpoint's w stands for 1 + w (Gemma)
        self.offset_folded = False
        # Gemma in a 16-bit dtype: 1 + w in float32, and the norm's own float32 formula (see above).
        self.scale_f32: torch.Tensor | None = None
        self.ops: LayerOps = TORCH_LAYER_OPS  # the model sets its choice (use_fused_ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale_f32 is not None:
            return self._gemma_norm(x)
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (norm(x + residual), x + residual); may overwrite both inputs (the fused op does)."""
        if self.scale_f32 is not None:
            residual = x + residual
            return self._gemma_norm(residual), residual
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)

    def _gemma_norm(self, x: torch.Tensor) -> torch.Tensor:
        assert self.scale_f32 is not None
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.scale_f32).to(x.dtype)

    @torch.no_grad()
    def fold_unit_offset(self, stored: bool = False) -> None:
        """Once the checkpoint's w is loaded: weight = 1 + w where the norm has a unit offset (idempotent).
        stored: the loaded weight already is 1 + w (a Gemma GGUF from llama.cpp's converter)."""
        if self.unit_offset and not self.offset_folded:
            if self.weight.dtype != torch.float32:
                self.scale_f32 = self.weight.float() if stored else 1.0 + self.weight.float()
            if not stored:
                self.weight.add_(1.0)
            self.offset_folded = True
