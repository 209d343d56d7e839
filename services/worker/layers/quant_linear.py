"""Linear layers and the embedding over GGUF-quantized weights, kept in the blocks the file stores.

A decode step reads every weight once and is bound by memory bandwidth, so reading Q4_1 (0.625 bytes
a weight) instead of float32 (4 bytes) is the win; the C++ kernel (kernels/cpu/quant_linear.cpp)
decodes each block inside the dot products, never into a float32 copy of the weight. The weight
bytes are plain attributes, not parameters or buffers: the model is built on the meta device and
`to_empty` must not replace them, and nothing should cast or save them like a dense tensor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

# GGML type numbers (the GGUF file's own) the kernel runs.
KERNEL_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12}

# How the linears take their activations: `float32` (the default: results within float rounding of the
# dequantized reference) or `int8` (from 8 rows on each 32-block of a row quantized to int8 and integer
# dot products, as llama.cpp does: faster at large batches, ~0.5% relative error per linear, and greedy
# outputs drift from the float32 reference; see docs/cpu-performance.md).
ACTIVATIONS_ENV = "PAGEDSERVE_QUANT_ACTIVATIONS"
ACTIVATION_MODES = {"float32": 0, "int8": 1}  # quant_linear's `mode`


def activation_mode() -> int:
    """quant_linear's `mode` for PAGEDSERVE_QUANT_ACTIVATIONS (float32 when unset)."""
    value = os.environ.get(ACTIVATIONS_ENV, "").strip().lower() or "float32"
    if value not in ACTIVATION_MODES:
        raise ValueError(f"{ACTIVATIONS_ENV} must be one of {', '.join(ACTIVATION_MODES)}; got {value!r}")
    return ACTIVATION_MODES[value]


@dataclass(frozen=True, slots=True)
class QuantTensor:
    """One weight in GGML blocks: `blocks` [rows, row_bytes] uint8 of type `type_name`. `source`: the
    checkpoint format it came from (a GGUF as stored, or a GPTQ/AWQ/compressed-tensors repack)."""

    type_name: str
    blocks: torch.Tensor
    in_features: int
    source: str = "gguf"
    # Column j of the blocks multiplies input input_order[j] (GPTQ's desc_act, sorted into groups);
    # None: input j.
    input_order: torch.Tensor | None = None

    @property
    def type_id(self) -> int:
        return KERNEL_TYPES[self.type_name]

    @property
    def out_features(self) -> int:
        return self.blocks.shape[0]


def quant_ops():
    """The kernel's torch.ops namespace on the best ISA path that builds (KernelBuildError if none)."""
    from pagedserve.kernels.cpu.build import QUANT_LINEAR
    from pagedserve.kernels.cpu.dispatch import load_ops

    return load_ops(QUANT_LINEAR)


class QuantLinear(nn.Module):
    """y = x W^T + b, W decoded block by block inside the kernel. float32 activations in and out."""

    def __init__(self, weight: QuantTensor, bias: torch.Tensor | None = None, ops=None) -> None:
        """bias: a tensor is copied as float32; an nn.Parameter (float32, e.g. on the meta device) stays a
        parameter, for the loader to fill like any other."""
        super().__init__()
        self.weight_type, self.source = weight.type_name, weight.source
        self.out_features, self.in_features = weight.out_features, weight.in_features
        self.blocks = weight.blocks.contiguous()
        self.type_id = weight.type_id
        self.input_order = weight.input_order
        if isinstance(bias, nn.Parameter):
            self.bias = bias
        else:
            self.bias = None if bias is None else bias.detach().float().contiguous()
        self.ops = ops or quant_ops()
        self.mode = activation_mode()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_order is not None:
            x = x.index_select(-1, self.input_order)
        return self.ops.quant_linear(x, self.blocks, self.type_id, self.bias, self.mode)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.weight_type}"


class QuantEmbedding(nn.Module):
    """Token ids -> rows of a quantized embedding, each decoded on lookup (T rows a step, not the vocab)."""

    def __init__(self, weight: QuantTensor, ops=None) -> None:
        super().__init__()
        self.weight_type, self.source = weight.type_name, weight.source
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features
        self.blocks = weight.blocks.contiguous()
        self.type_id = weight.type_id
        self.ops = ops or quant_ops()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.ops.quant_rows(self.blocks, self.type_id, ids, self.embedding_dim)

    def as_linear(self) -> QuantLinear:
        """The tied LM head over the same blocks (no copy)."""
        weight = QuantTensor(self.weight_type, self.blocks, self.embedding_dim, self.source)
        return QuantLinear(weight, None, self.ops)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, weights={self.weight_type}"


def weight_types(module: nn.Module) -> dict[tuple[str, str], int]:
    """(source, type name) -> how many quantized linears/embeddings (and MoE expert sets, layers/moe.py)
    under `module` hold it (start log, runtime): ("gguf", "Q4_1") for a GGUF's stored blocks, ("gptq",
    "Q4_1") for GPTQ repacked to Q4_1."""
    counts: dict[tuple[str, str], int] = {}
    for m in module.modules():
        if isinstance(getattr(m, "weight_type", None), str) and isinstance(getattr(m, "source", None), str):
            key = (m.source, m.weight_type)
            counts[key] = counts.get(key, 0) + 1
    return counts
