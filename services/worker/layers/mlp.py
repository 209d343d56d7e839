"""The gated MLP (act(gate) * up, then down), gate and up fused into one projection.

The activation is SiLU (Llama, Qwen, Mistral, Phi-3: one fused C++ kernel on the CPU) or GELU with the
tanh approximation (Gemma's `gelu_pytorch_tanh`: torch's own op, the one transformers calls).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, LayerOps


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] = [gate | up] per row -> gelu_tanh(gate) * up [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


class GatedMLP(nn.Module):
    def __init__(
        self, hidden_size: int, intermediate_size: int, bias: bool = False, act: str = "silu"
    ) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.silu = act == "silu"  # else gelu_pytorch_tanh (the registry admits no other)
        self.ops: LayerOps = TORCH_LAYER_OPS  # the model sets its choice (use_fused_ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj.forward(x)
        hidden = self.ops.silu_and_mul(gate_up) if self.silu else gelu_tanh_and_mul(gate_up)
        return self.down_proj.forward(hidden)
