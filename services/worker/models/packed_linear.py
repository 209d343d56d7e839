"""Linear layers whose weights are packed once, at load time, into the CPU GEMM library's own layout.

In bfloat16 `F.linear` hands oneDNN the dense weight on every call, to be re-laid out or read in a
slower layout; packing it once
(`mkldnn._reorder_linear_weight`, the op inductor's freezing pass uses) and calling the packed GEMM
(`mkldnn._linear_pointwise`) skips that. The packed weight serves any number of rows: the decode
batch changes every step and a prefill chunk has hundreds of rows, all with the same packed copy.

Only bfloat16 is packed. There the packed GEMM returns the very bits `F.linear` does (both are
oneDNN) and measured 1.2-1.5x faster on the whole model's linears at 1-128 rows (ops/microbench/
linears_ab; 512 rows measured 0.83-1.4x, noise included). In float32 `F.linear` is MKL's sgemm:
oneDNN's packed float32 GEMM sums in another order (~4e-6 apart on these shapes) and measured
slower at 1-2 rows, 1.1-1.5x faster at 4-192 and about even from 256 up, so it would need a row-count
dispatch and the dense copy kept; MKL's own packed sgemm (`mkl._mkl_linear`) uses its packing only
when the row count equals the one it was packed for and otherwise silently runs `F.linear`, which
is every decode step whose batch changed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PACKED_DTYPES = (torch.bfloat16,)
# float32 rows up to this many take our kernel (RowsLinear); above it MKL's sgemm is faster.
ROWS_KERNEL_MAX_ROWS = 8


def packing_available(dtype: torch.dtype, device: torch.device) -> bool:
    """True where this torch build has the packed oneDNN GEMM for `dtype` on `device` and oneDNN has a
    path for `dtype` on this CPU: its bf16 reorder raises on a CPU without avx_ne_convert or
    AVX-512 BW/VL/DQ (an AMD EPYC Zen 3, say), so there the model keeps its dense weights."""
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
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


class RowsLinear(nn.Module):
    """float32 y = x W^T + b: our C++ kernel for a decode step's few rows (kernels/cpu/linear.cpp,
    which streams each weight row once), F.linear (MKL's sgemm) from `max_rows` + 1 rows up, where
    a blocked GEMM is faster. Both read the same dense weight: no second copy."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, op, max_rows: int) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight.detach()  # the model's own tensor (a tied embedding stays shared)
        self.bias = None if bias is None else bias.detach()
        self._op, self.max_rows = op, max_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] <= self.max_rows and x.stride(1) == 1:
            return self._op(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, rows_kernel<={self.max_rows}"
        )


def rows_linear_op():
    """Our float32 few-rows linear on this CPU's ISA path, or None where it cannot be built."""
    from pagedserve.kernels.cpu.build import LINEAR
    from pagedserve.kernels.cpu.dispatch import try_load_ops

    ops = try_load_ops(LINEAR)
    return None if ops is None else ops.linear_rows.default


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Module | None:
    """The CPU linear for this weight: bfloat16 packed for oneDNN, float32 on our few-rows kernel; None
    where neither applies (the linear stays as it is)."""
    if weight.dtype == torch.float32 and weight.device.type == "cpu":
        op = rows_linear_op()
        return None if op is None else RowsLinear(weight, bias, op, ROWS_KERNEL_MAX_ROWS)
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
    """What runs the linears under `module`, in words: `onednn-packed`, `rows-kernel<=N+F.linear`
    or `F.linear` (for the start log and the worker's announcements)."""
    for child in module.modules():
        if isinstance(child, PackedLinear):
            return "onednn-packed"
        if isinstance(child, RowsLinear):
            return f"rows-kernel<={child.max_rows}+F.linear"
    return "F.linear"
