"""The decoder layer's small ops (RMSNorm, the residual add before it, SiLU-and-mul, the in-place
rotary embedding of q and k, a MoE layer's routing), two ways.

`TORCH_LAYER_OPS`: the plain torch forms, op by op as Hugging Face writes them; any device and dtype,
and the reference the tests hold the kernels to. `CppLayerOps`: our fused C++ kernels
(kernels/cpu/layer_ops.cpp) on the CPU in float32 and bfloat16, one call each where the torch forms
take 2-8 ops, each a Python call and a temporary. `layer_ops_for` picks, falling back to torch
(logged once) where the kernels cannot be built.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

FUSED_DTYPES = (torch.float32, torch.bfloat16)


def apply_rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim], any strides (a view into the fused q/k/v output) -> x, rotated in place.

    The same products and sums as `apply_rotary`, so the same bits, in 6 ops instead of 7 and no
    concatenated copy; one call can rotate q and k together (adjacent in the q/k/v output)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    x2_sin, x1_sin = x2 * sin, x1 * sin  # both read before either half is overwritten
    x1.mul_(cos).sub_(x2_sin)
    x2.mul_(cos).add_(x1_sin)
    return x


class LayerOps(Protocol):
    name: str

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (rms_norm(x + residual), x + residual). May overwrite x and residual."""
        ...

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2I] = [gate | up] per row -> silu(gate) * up [T, I]."""
        ...

    def rotary_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, head_dim] (any strides) rotated in place -> x; cos, sin [T, 1, head_dim/2]."""
        ...

    def moe_route(
        self, x: torch.Tensor, router: torch.Tensor, top_k: int, normalize: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden], router [experts, hidden] -> (expert ids [T, top_k] int64, their weights
        [T, top_k] in x's dtype): softmax in float32 of the router's logits, top-k, renormalised over
        the k where `normalize`, as the checkpoints' reference code routes."""
        ...


class TorchLayerOps:
    name = "torch"

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # Normalise in float32 whatever the model dtype: bf16 sums of squares lose too much; the
        # weight multiplies after rounding back, in the model dtype, as the checkpoints were trained.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)

    @staticmethod
    def add_rms_norm(
        x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = x + residual
        return TorchLayerOps.rms_norm(residual, weight, eps), residual

    @staticmethod
    def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return apply_rotary_(x, cos, sin)

    @staticmethod
    def moe_route(
        x: torch.Tensor, router: torch.Tensor, top_k: int, normalize: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(F.linear(x, router), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, top_k, dim=-1)
        if normalize:
            weights /= weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(x.dtype)


TORCH_LAYER_OPS = TorchLayerOps()


class CppLayerOps:
    name = "cpp"

    def __init__(self, isa: str | None = None) -> None:
        """The best ISA path this CPU runs, or exactly `isa` (tests hold each path to the torch forms)."""
        from pagedserve.kernels.cpu.build import LAYER_OPS, load_extension
        from pagedserve.kernels.cpu.dispatch import kernel_paths, load_ops

        # KernelBuildError where this machine cannot build it
        ops = load_ops(LAYER_OPS) if isa is None else load_extension(LAYER_OPS, isa)
        self.isa = isa or kernel_paths()["layer_ops"]
        # The resolved overloads: calling them skips the packet's lookup on every call.
        self.rms_norm = ops.rms_norm.default
        self.silu_and_mul = ops.silu_and_mul.default
        self._fused_add_rms_norm = ops.fused_add_rms_norm.default
        self._rotary_ = ops.rotary_.default
        self.moe_route = ops.moe_route.default  # the torch form's ops, called from C++

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._fused_add_rms_norm(x, residual, weight, eps)  # in place: residual += x; x = norm(residual)
        return x, residual

    def rotary_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        self._rotary_(x, cos, sin)  # the same bits as apply_rotary_
        return x


_cpp: CppLayerOps | None = None
_cpp_failed = False


def layer_ops_for(dtype: torch.dtype, device: torch.device) -> LayerOps:
    """The fused C++ ops where they apply (CPU, float32/bfloat16, buildable here), else the torch ones."""
    global _cpp, _cpp_failed
    if device.type != "cpu" or dtype not in FUSED_DTYPES or _cpp_failed:
        return TORCH_LAYER_OPS
    if _cpp is None:
        from pagedserve.kernels.cpu.build import KernelBuildError

        try:
            _cpp = CppLayerOps()
        except KernelBuildError:
            _cpp_failed = True  # still correct, only slower; the loader logged why, on one line
            return TORCH_LAYER_OPS
    return _cpp
