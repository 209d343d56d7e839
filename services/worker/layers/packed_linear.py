"""Linear layers whose weights are packed once, at load time, into oneDNN's own layout.

`F.linear` hands the GEMM library the dense weight on every call (MKL's sgemm in float32, oneDNN in
bfloat16), to be re-laid out or read in a slower layout; packing it once
(`mkldnn._reorder_linear_weight`, the op inductor's freezing pass uses) and calling oneDNN's packed
GEMM (`mkldnn._linear_pointwise`) skips that. oneDNN JIT-compiles its kernels for the CPU it finds
(AMX, AVX-512, AVX2...), so the same code is fast on an AMD EPYC too. The packed weight serves any
number of rows and replaces the dense one: one copy of the weights.

What was measured (docs/cpu-performance.md, "Linear layers"):
- bfloat16: the packed GEMM returns the very bits `F.linear` does (both oneDNN) and ran 1.2-1.5x
  faster on the whole model's linears at 1-128 rows on a Sapphire Rapids.
- float32 on an AMD EPYC (Zen 3, AVX2, 2 threads), SmolLM2-135M's linears for one step: MKL's sgemm
  took 48.7 / 166.8 / 331.6 ms at 1 / 8 / 64 rows, the packed GEMM 30.6 / 63.5 / 212.0 ms, and
  1.3-1.4x less from 128 rows to a 2048-token prefill. It sums in another order than MKL (~1e-6
  relative apart).

oneDNN builds and caches one primitive per distinct row count (~0.2 MB each for a [960 x 576]
weight: 129 row counts took +28 MB of RSS). A decode batch changes every step, so the worker would
grow with every new batch size; rows are therefore padded up to a bucket (`row_bucket`): every count
up to 16, then four per power of two. The cache then holds at most 45 primitives per weight shape for
a 2048-token step budget (4 more per doubling of it), bounded and reached early; padding is under a
quarter of the rows, where the GEMM is compute-bound (17 rows and up).
"""

from __future__ import annotations

import torch
from torch import nn

PACKED_DTYPES = (torch.float32, torch.bfloat16)


def row_bucket(rows: int) -> int:
    """The row count a packed GEMM runs for `rows` rows: every count up to 16, then four buckets per
    power of two (20, 24, 28, 32, 40, 48, ...), so under 25% of the rows are padding."""
    if rows <= 16:
        return rows
    step = 1 << (rows.bit_length() - 3)  # a quarter of the power of two at or below rows
    return -(-rows // step) * step


def packing_available(dtype: torch.dtype, device: torch.device) -> bool:
    """True where this torch build has the packed oneDNN GEMM for `dtype` on `device` and oneDNN has a
    path for `dtype` on this CPU: its bf16 reorder raises on a CPU without avx_ne_convert or
    AVX-512 BW/VL/DQ (an AMD EPYC Zen 3, say), so there a bf16 model keeps its dense weights."""
    return (
        device.type == "cpu"
        and dtype in PACKED_DTYPES
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and (dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))
    )


class PackedLinear(nn.Module):
    """y = x W^T + b with W held only in oneDNN's packed layout (the dense copy is dropped)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # Plain attributes, not parameters or buffers: an opaque oneDNN tensor cannot be moved,
        # viewed or saved like a dense one, and nothing should try to.
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self.bias = None if bias is None else bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] if x.dim() == 2 else 0
        bucket = row_bucket(rows) if rows else 0
        if bucket != rows:  # padded with zeros: the extra rows' outputs are computed and dropped
            padded = x.new_zeros((bucket, self.in_features))
            padded[:rows] = x
            return self._gemm(padded)[:rows]
        return self._gemm(x)

    def _gemm(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Module | None:
    """A PackedLinear for this weight, or None where packing is not available for it."""
    if not packing_available(weight.dtype, weight.device):
        return None
    return PackedLinear(weight, bias)


def prepack_linears(module: nn.Module) -> int:
    """Replace every nn.Linear under `module` by its PackedLinear where packing is available;
    -> how many were packed (0 leaves the module exactly as it was)."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                packed = pack_linear(child.weight, child.bias)
                if packed is not None:
                    setattr(parent, name, packed)
                    count += 1
    return count


def linears_kind(module: nn.Module) -> str:
    """What runs the linears under `module`: `onednn-packed` or `F.linear` (start log, announcements)."""
    return "onednn-packed" if any(isinstance(m, PackedLinear) for m in module.modules()) else "F.linear"
