"""Linear layers and the embedding over GGUF-quantized weights, kept in the blocks the file stores.

A decode step reads every weight once and is bound by memory bandwidth, so reading Q4_1 (0.625 bytes
a weight) instead of float32 (4 bytes) is the win; the C++ kernel (kernels/cpu/quant_linear.cpp)
decodes each block inside the dot products, never into a float32 copy of the weight. The weight
bytes are plain attributes, not parameters or buffers: the model is built on the meta device and
`to_empty` must not replace them, and nothing should cast or save them like a dense tensor.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

# GGML type numbers (the GGUF file's own) the kernel runs: every common GGUF type, F16 and BF16 included.
KERNEL_TYPES = {
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q2_K": 10,
    "Q3_K": 11,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "IQ4_NL": 20,
    "IQ4_XS": 23,
    "BF16": 30,
}
FLOAT_TYPES = ("F16", "BF16")  # stored values, no codes: rows must be whole groups of 32 weights


def runs_packed(type_name: str, dims: tuple[int, ...]) -> bool:
    """Whether a GGUF tensor of this type and shape (ggml order: dims[0] the row length) stays in its
    stored blocks: a type the kernel runs; for F16/BF16 a matrix (a 1-D F16 norm is a dense parameter)
    whose rows are whole groups of 32 weights."""
    if type_name not in KERNEL_TYPES:
        return False
    return type_name not in FLOAT_TYPES or (len(dims) >= 2 and dims[0] % 32 == 0)


# How the linears take their activations (ServeConfig.quant_activations): `float32` (the default: results
# within float rounding of the dequantized reference) or `int8` (each 32-block of a row quantized to int8
# and integer dot products, as llama.cpp does, below the kernel's panels, which stay a float32 GEMM,
# faster there: ~0.5% relative error per linear, and greedy outputs drift from the float32 reference; see
# docs/cpu-performance.md).
ACTIVATIONS_ENV = "PAGEDSERVE_QUANT_ACTIVATIONS"  # the config field's variable
ACTIVATION_MODES = {"float32": 0, "int8": 1}  # quant_linear's `mode`


def activation_mode(value: str | None = None) -> int:
    """quant_linear's `mode` for `value` (a worker's configured quant_activations); None: the
    PAGEDSERVE_QUANT_ACTIVATIONS variable, float32 when unset (a model loaded outside a worker: tests,
    microbenchmarks)."""
    source = "quant_activations" if value is not None else ACTIVATIONS_ENV
    if value is None:
        value = os.environ.get(ACTIVATIONS_ENV, "").strip().lower() or "float32"
    if value not in ACTIVATION_MODES:
        raise ValueError(f"{source} must be one of {', '.join(ACTIVATION_MODES)}; got {value!r}")
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
    """y = x W^T + b, W decoded block by block inside the kernel. float32 activations in and out.

    W may be the rows of several checkpoint tensors one after another (a fused q/k/v or gate/up), each in
    its own type: a Q4_K_M file stores attn_v in Q6_K beside Q4_K q and k. Each run of parts of one type
    is one kernel call over its rows, and their outputs are joined."""

    def __init__(
        self,
        weight: QuantTensor | Sequence[QuantTensor],
        bias: torch.Tensor | None = None,
        ops=None,
        mode: int | None = None,
    ) -> None:
        """weight: one tensor, or the parts of a fused projection (the same input features and input
        order; their rows concatenated, which copies them). bias: a tensor is copied as float32; an
        nn.Parameter (float32, e.g. on the meta device) stays a parameter, for the loader to fill.
        mode: activation_mode's (None: from the environment)."""
        super().__init__()
        parts = [weight] if isinstance(weight, QuantTensor) else list(weight)
        if not parts or len({p.in_features for p in parts}) != 1:
            raise ValueError("QuantLinear needs one or more weights with the same in_features")
        self.source, self.in_features = parts[0].source, parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.tensor_types = tuple(p.type_name for p in parts)  # one per checkpoint tensor (start log)
        self.weight_type = "+".join(dict.fromkeys(self.tensor_types))
        self.input_order = parts[0].input_order
        self.ops = ops or quant_ops()
        self.mode = activation_mode() if mode is None else mode
        # (kernel type id, blocks, first output row) per run of parts of one type
        self.runs: list[tuple[int, torch.Tensor, int]] = []
        row = 0
        for type_name in _runs(self.tensor_types):
            run = parts[: len(type_name)]
            parts = parts[len(type_name) :]
            blocks = run[0].blocks.contiguous() if len(run) == 1 else torch.cat([p.blocks for p in run])
            self.runs.append((*kernel_layout(self.ops, self.mode, run[0].type_id, blocks), row))
            row += blocks.shape[0]
        if isinstance(bias, nn.Parameter):
            self.bias = bias
        else:
            self.bias = None if bias is None else bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_order is not None:
            x = x.index_select(-1, self.input_order)
        if len(self.runs) == 1:
            type_id, blocks, _ = self.runs[0]
            return self.ops.quant_linear(x, blocks, type_id, self.bias, self.mode)
        outs = []
        for type_id, blocks, row in self.runs:
            bias = None if self.bias is None else self.bias[row : row + blocks.shape[0]]
            outs.append(self.ops.quant_linear(x, blocks, type_id, bias, self.mode))
        return torch.cat(outs, -1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.weight_type}"


def kernel_layout(ops, mode: int, type_id: int, blocks: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(type id, blocks) in the layout the kernel runs fastest. With int8 activations, on a path that has
    int8 tiles over Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K with every 8 output rows interleaved (the avx2 and avx512
    paths: kernels/cpu/int8_interleaved.cpp, 1.1-1.9x the stored layout's speed at 1-1000 rows), those types
    take that layout: the same bytes reordered, in place of the stored copy. Everything else, and a run
    whose rows are not whole chunks of 8, stays as stored."""
    if mode != ACTIVATION_MODES["int8"] or blocks.shape[0] % 8:
        return type_id, blocks
    layout = ops.interleaved_type(type_id)
    return (layout, ops.interleave_rows(blocks, type_id)) if layout else (type_id, blocks)


def _runs(types: tuple[str, ...]) -> list[tuple[str, ...]]:
    """("Q4_K", "Q4_K", "Q6_K") -> [("Q4_K", "Q4_K"), ("Q6_K",)]: consecutive equal types grouped."""
    runs: list[tuple[str, ...]] = []
    for t in types:
        if runs and runs[-1][0] == t:
            runs[-1] = (*runs[-1], t)
        else:
            runs.append((t,))
    return runs


class QuantEmbedding(nn.Module):
    """Token ids -> rows of a quantized embedding, each decoded on lookup (T rows a step, not the vocab)."""

    def __init__(self, weight: QuantTensor, ops=None, mode: int | None = None) -> None:
        super().__init__()
        self.mode = activation_mode() if mode is None else mode  # a tied head's (as_linear)
        self.weight_type, self.source = weight.type_name, weight.source
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features
        self.blocks = weight.blocks.contiguous()
        self.type_id = weight.type_id
        self.ops = ops or quant_ops()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.ops.quant_rows(self.blocks, self.type_id, ids, self.embedding_dim)

    def as_linear(self) -> QuantLinear:
        """The tied LM head over the same blocks (no copy). Where the head takes another layout
        (kernel_layout), the embedding reads that one too (the kernel's row lookup takes every layout),
        so the two still share one copy."""
        weight = QuantTensor(self.weight_type, self.blocks, self.embedding_dim, self.source)
        head = QuantLinear(weight, None, self.ops, self.mode)
        head.tensor_types = ()  # the embedding's tensor, counted there
        self.type_id, self.blocks, _ = head.runs[0]
        return head

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, weights={self.weight_type}"


def weight_types(module: nn.Module) -> dict[tuple[str, str], int]:
    """(source, type name) -> how many checkpoint tensors under `module` are held in it (start log,
    runtime), as llama.cpp counts a file's types: ("gguf", "Q4_1") for a GGUF's stored blocks, ("gptq",
    "Q4_1") for GPTQ repacked to Q4_1. A fused q/k/v counts its three tensors; a MoE layer's expert set
    (layers/moe.py) counts once."""
    counts: dict[tuple[str, str], int] = {}
    for m in module.modules():
        source, weight_type = getattr(m, "source", None), getattr(m, "weight_type", None)
        if isinstance(m, QuantLinear):
            keys = [(m.source, t) for t in m.tensor_types]
        elif isinstance(weight_type, str) and isinstance(source, str):
            keys = [(source, weight_type)]  # a quantized embedding, a MoE expert set
        else:
            keys = []
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
    return counts


INTERLEAVED = 100  # kernel type ids 100 + GGML type: every 8 output rows interleaved (kernel_layout)


def weight_layout(module: nn.Module) -> str:
    """How the quantized matrices under `module` are laid out for the kernel (start log, runtime):
    `rows interleaved by 8: N of M matrices` once kernel_layout took any, else `stored`. A fused run of
    parts, a MoE layer's expert set and an embedding each count once; a tied embedding reads its head's
    copy and is not counted again. How a user sees that the fast int8 path is on."""
    from pagedserve.services.worker.layers.moe import QuantExpertLinear

    matrices: dict[int, int] = {}  # blocks' address -> kernel type id
    for m in module.modules():
        if isinstance(m, QuantLinear):
            matrices.update((blocks.data_ptr(), type_id) for type_id, blocks, _ in m.runs)
        elif isinstance(m, (QuantEmbedding, QuantExpertLinear)):
            matrices[m.blocks.data_ptr()] = m.type_id
    interleaved = sum(t >= INTERLEAVED for t in matrices.values())
    return f"rows interleaved by 8: {interleaved} of {len(matrices)} matrices" if interleaved else "stored"


def quant_activations_kind(module: nn.Module) -> str:
    """How the linears over quantized weights under `module` take their activations (start log, runtime):
    `float32`, `int8`, or `none` where no linear is quantized."""
    from pagedserve.services.worker.layers.moe import QuantExpertLinear

    modes = {m.mode for m in module.modules() if isinstance(m, (QuantLinear, QuantExpertLinear))}
    names = [name for name, mode in ACTIVATION_MODES.items() if mode in modes]
    return "+".join(names) or "none"


def dense_weights(module: nn.Module) -> str:
    """What `module` holds in float rather than in quantized blocks (start log, runtime): `norms` (1-D
    weights only: norms, biases), `N matrices and norms` (dense linears, embedding or LM head besides),
    or `none`."""
    from pagedserve.services.worker.layers.packed_linear import PackedLinear

    matrices = vectors = 0
    for m in module.modules():
        if isinstance(m, (QuantLinear, QuantEmbedding)):
            continue
        matrices += isinstance(m, PackedLinear)  # its packed weight is an attribute, not a parameter
        for p in m.parameters(recurse=False):
            matrices += p.dim() >= 2
            vectors += p.dim() < 2
    if matrices:
        return f"{matrices} {'matrix' if matrices == 1 else 'matrices'}" + (" and norms" if vectors else "")
    return "norms" if vectors else "none"
