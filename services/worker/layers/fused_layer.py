"""A decoder layer as one C++ call (kernels/cpu/decoder_layer.cpp), where all of it runs our C++ kernels.

A one-request decode step calls ~14 kernels a layer, each for a few to a few dozen microseconds; from
Python each call also pays its round trip and argument parsing, ~4.5 ms of a ~14 ms step of the bundled
model (AMD EPYC Zen 3, 2 threads). The fused op makes the same kernel calls, in the same order, from C++:
its output is the Python layer's to the bit, so the Python layer stays the reference the tests hold it to.

A layer is fused when every part of it is one of those kernels on one ISA path: float32 RMSNorms (Gemma's
four a layer too), our layer ops, q/k/v with optional per-head q/k norms (Qwen3, Gemma 3) and a rotary of
all or part of each head, the C++ paged attention on a float K/V cache (no failpoints watching its
writes), linears that are GGUF-quantized without a GPTQ input order or float32 (F.linear, or oneDNN's
packed GEMM; adapters on either, where the LoRA kernel builds on that path), and a SiLU or GELU-tanh MLP
or a MoE block whose quantized experts run as one op and which has no shared expert. Anything else
(bfloat16 or float16 weights, int8 K/V, tensor parallelism, OLMoE's whole-projection norms) runs the
Python layer; `fuse_layer` says why in one phrase.

Adapters: the op takes each adapted linear's LoRA stacks as they are when the layer is fused, so the
model fuses again when a load grows them (`LoRABatch.version`), and a step whose adapter rows take
LoRALinear's torch paths (many rows, `LoRABatch.row_slots` None) runs the Python layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pagedserve.kernels.attention import AttentionMetadata
from pagedserve.kernels.cpu.backend import CppAttentionBackend
from pagedserve.kernels.cpu.build import (
    DECODER_LAYER,
    LORA,
    QUANT_LINEAR,
    KernelBuildError,
    library_name,
    load_extension,
)
from pagedserve.kernels.layer_ops import CppLayerOps
from pagedserve.services.worker.layers.attention import Attention
from pagedserve.services.worker.layers.lora import LoRABatch, LoRALinear, cpp_lora_delta
from pagedserve.services.worker.layers.mlp import GatedMLP
from pagedserve.services.worker.layers.moe import QuantExpertLinear, SparseMoeBlock
from pagedserve.services.worker.layers.norm import RMSNorm
from pagedserve.services.worker.layers.packed_linear import PackedLinear
from pagedserve.services.worker.layers.quant_linear import QuantLinear


@dataclass(frozen=True, slots=True)
class FusedLayer:
    """The op and the layer's flat argument lists (the layout decoder_layer.cpp reads)."""

    op: Any
    tensors: list[torch.Tensor | None]
    ints: list[int]
    floats: list[float]
    lora: LoRABatch | None = None  # the adapters' rows per step, where adapters target the layer

    def takes_this_step(self) -> bool:
        """Whether this step's adapter rows, if any, take the LoRA kernel (else the Python layer runs)."""
        lora = self.lora
        return lora is None or not lora.groups or lora.row_slots is not None

    def __call__(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.op(
            x,
            residual,
            cos,
            sin,
            k_cache,
            v_cache,
            meta.slot_mapping,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            None if self.lora is None else self.lora.row_slots,  # set only for a step with adapter rows
            self.tensors,
            self.ints,
            self.floats,
        )


def _plain_norm(norm: Any, isa: str) -> bool:
    return (
        type(norm) is RMSNorm
        and norm.scale_f32 is None
        and norm.weight.dtype == torch.float32
        and isinstance(norm.ops, CppLayerOps)
        and norm.ops.isa == isa
    )


def _on_path(kernel_user: QuantLinear | QuantExpertLinear, isa: str) -> bool:
    """Whether its quantized-linear kernels are the build of `isa`."""
    return kernel_user.ops.name == library_name(QUANT_LINEAR, isa)


def _base(linear: Any) -> Any:
    return linear.base if type(linear) is LoRALinear else linear


def _quantized(linear: Any, isa: str) -> bool:
    base = _base(linear)
    return type(base) is QuantLinear and base.input_order is None and _on_path(base, isa)


def _dense(linear: Any) -> bool:
    """A float32 nn.Linear or PackedLinear (a dense checkpoint's, or a GGUF's projection kept dense)."""
    base = _base(linear)
    if type(base) is PackedLinear:
        return base.packed_weight.dtype == torch.float32
    return type(base) is nn.Linear and base.weight.dtype == torch.float32


def _supported(linear: Any, isa: str) -> bool:
    return _quantized(linear, isa) or _dense(linear)


def _lora_on_path(linear: Any, isa: str) -> bool:
    """Unadapted, or its adapters' kernel is the build of `isa` (LoRALinear's C++ path)."""
    if type(linear) is not LoRALinear:
        return True
    op = cpp_lora_delta()
    return op is not None and op.name().startswith(library_name(LORA, isa) + "::")


# A dense linear's kind in decoder_layer.cpp's layout (a GGUF linear's is its number of runs).
DENSE, PACKED = -1, -2


def _add_linear(linear: Any, tensors: list[torch.Tensor | None], ints: list[int]) -> None:
    base = _base(linear)
    tensors.append(base.bias)
    if type(base) is PackedLinear:
        ints.append(PACKED)
        tensors.append(base.packed_weight)
    elif type(base) is nn.Linear:
        ints.append(DENSE)
        tensors.append(base.weight)
    else:
        ints.append(len(base.runs))
        for type_id, blocks, _ in base.runs:
            tensors.append(blocks)
            ints.append(type_id)
    if type(linear) is not LoRALinear or not linear.rank:  # no adapter has targeted it yet
        ints.append(0)
        return
    ints.append(len(linear.b))
    tensors += [linear.a, *linear.b]


def fuse_layer(
    input_norm: Any, attn: Any, post_norm: Any, mlp: Any, out_norms: tuple[Any, Any] | None = None
) -> FusedLayer | str:
    """A Llama-family layer's parts -> its fused form, or why it runs in Python. out_norms: Gemma's norms
    of the attention's and the MLP's outputs (post_norm is then its pre-feedforward norm)."""
    ops = input_norm.ops
    if not isinstance(ops, CppLayerOps):
        return "the C++ layer ops are off"
    isa = ops.isa
    norms = (input_norm, post_norm, *(out_norms or ()))
    if not all(_plain_norm(norm, isa) for norm in norms) or len({norm.eps for norm in norms[1:]}) > 1:
        return "its norms are not the C++ float32 ones"
    if type(attn) is not Attention or attn.qk_norm_full or attn.clip_qkv is not None:
        return "its attention normalises or clips the whole projection"
    backend = attn.backend
    if type(backend) is not CppAttentionBackend or backend.isa != isa or "write_kv" in vars(backend):
        return "its attention is not the C++ kernel on a float K/V cache"
    q_norm, k_norm = attn.q_norm, attn.k_norm
    if q_norm is not None and not (
        k_norm is not None
        and _plain_norm(q_norm, isa)
        and _plain_norm(k_norm, isa)
        and q_norm.eps == k_norm.eps
    ):
        return "its q/k norms are not the C++ float32 ones"
    if not (_supported(attn.qkv_proj, isa) and _supported(attn.o_proj, isa)):
        return "its attention's linears are neither GGUF-quantized nor float32"
    tensors: list[torch.Tensor | None] = [
        input_norm.weight,
        post_norm.weight,
        None if q_norm is None else q_norm.weight,
        None if k_norm is None else k_norm.weight,
    ]
    linears: list[Any] = [attn.qkv_proj, attn.o_proj]  # checked above
    modes: set[int] = set()  # the quantized linears' and experts' (one for all, or no fusing)
    ints = [attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.rules.window or 0, 0]  # the mode: below
    mlp_tensors: list[torch.Tensor | None] = []
    mlp_ints: list[int] = []
    if type(mlp) is GatedMLP:
        if not (_supported(mlp.gate_up_proj, isa) and _supported(mlp.down_proj, isa)):
            return "its MLP's linears are neither GGUF-quantized nor float32"
        linears += [mlp.gate_up_proj, mlp.down_proj]
        tensors.append(None)  # no router
        ints += [0, 0, 0, int(not mlp.silu)]  # no routing: top_k 0; GELU-tanh or SiLU
    elif type(mlp) is SparseMoeBlock:
        experts = mlp.experts
        gate_up, down = experts.gate_up_proj, experts.down_proj
        quantized = isinstance(gate_up, QuantExpertLinear) and isinstance(down, QuantExpertLinear)
        if mlp.shared_expert is not None or not (experts.fused and quantized):
            return "its MoE block has a shared expert or unquantized experts"
        assert isinstance(gate_up, QuantExpertLinear) and isinstance(down, QuantExpertLinear)
        if not (_on_path(gate_up, isa) and _on_path(down, isa)) or mlp.gate.weight.dtype != torch.float32:
            return "its experts' kernels are on another path"
        modes |= {gate_up.mode, down.mode}
        tensors.append(mlp.gate.weight)
        ints += [mlp.top_k, int(mlp.normalize_top_k), experts.num_experts, 0]
        mlp_tensors = [gate_up.blocks, down.blocks]
        mlp_ints = [gate_up.type_id, down.type_id]
    else:
        return "its MLP is neither a gated MLP nor a sparse MoE block"
    modes |= {_base(linear).mode for linear in linears if _quantized(linear, isa)}
    if len(modes) > 1:
        return "its linears take activations in different modes"
    ints[4] = next(iter(modes), 0)  # a dense layer's linears take no mode
    tensors += [None, None] if out_norms is None else [norm.weight for norm in out_norms]
    if not all(_lora_on_path(linear, isa) for linear in linears):
        return "its adapters' kernel is not on its path"
    for linear in linears:
        _add_linear(linear, tensors, ints)
    try:
        op = load_extension(DECODER_LAYER, isa).decoder_layer.default
    except KernelBuildError as e:
        return f"the fused layer op did not build ({e})"
    q_eps = 0.0 if q_norm is None else q_norm.eps
    floats = [input_norm.eps, post_norm.eps, q_eps, attn.scale, attn.rules.softcap or 0.0]
    lora = next((linear.batch for linear in linears if type(linear) is LoRALinear), None)
    return FusedLayer(op, tensors + mlp_tensors, ints + mlp_ints, floats, lora)
