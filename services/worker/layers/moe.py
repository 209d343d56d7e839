"""The sparse mixture-of-experts MLP (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE): a router picks `top_k` of
`num_experts` gated MLPs for each token, and their outputs are summed, weighted by the router.

Routing follows the checkpoints' reference code exactly: router logits in the model dtype (the router
stays dense: `Router`), softmax in float32, top-k of the probabilities, renormalised over the k when the config says so (Mixtral always,
the others by `norm_topk_prob`), the weights rounded back to the model dtype (`LayerOps.moe_route`: those
torch ops, called from Python or, where the C++ layer ops load, all from one C++ op). Qwen2-MoE adds a shared
expert every token runs, scaled by sigmoid(a learned [hidden -> 1] gate).

A step's tokens are grouped by expert (a stable sort of the (token, k) pairs by expert id): each
expert hit runs its rows as one matrix product per projection, and the weighted rows are summed back
into their tokens in expert order (index_add_), the order Hugging Face sums them in. Experts are
[num_experts, out, in] tensors: dense parameters, or GGUF blocks kept packed (`QuantExpertLinear`),
where expert e's rows are the contiguous byte rows [e * out, (e + 1) * out) the quantized-linear
kernel runs as is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, LayerOps
from pagedserve.services.worker.layers.mlp import GatedMLP
from pagedserve.services.worker.layers.quant_linear import (
    QuantTensor,
    activation_mode,
    kernel_layout,
    quant_ops,
)


@dataclass(frozen=True, slots=True)
class MoeConfig:
    num_experts: int
    top_k: int
    expert_size: int  # each routed expert's intermediate size
    normalize_top_k: bool  # renormalise the k chosen probabilities to sum to 1
    shared_expert_size: int  # 0: no shared expert (Qwen2-MoE has one, with a sigmoid gate)
    sparse_layers: frozenset[int]  # the layers whose MLP is this block; the others are dense


class Router(nn.Module):
    """The router's [num_experts x hidden] linear, always dense and never repacked: a matrix-vector
    product of 32 rows takes a few microseconds in `F.linear`, ~80 as a oneDNN-packed linear (its
    per-call overhead), and a quantized router would round which experts run, not just by how much
    (llama.cpp's files keep it F32 too). Not an nn.Linear, so neither repacking nor quantized
    installs take it. The routing reads its weight (`LayerOps.moe_route`)."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))


class ExpertLinear(nn.Module):
    """num_experts dense linears without bias: weight [num_experts, out, in]."""

    def __init__(self, num_experts: int, out_features: int, in_features: int) -> None:
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features))

    def forward(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight[expert])


class QuantExpertLinear(nn.Module):
    """num_experts linears in GGML blocks: `blocks` [num_experts * out, row_bytes], expert e's rows
    contiguous; each expert runs the quantized-linear kernel on its own slice (no copy)."""

    def __init__(self, weight: QuantTensor, num_experts: int, ops=None, mode: int | None = None) -> None:
        super().__init__()
        self.weight_type, self.source = weight.type_name, weight.source
        self.out_features, self.in_features = weight.out_features // num_experts, weight.in_features
        self.ops = ops or quant_ops()
        self.mode = activation_mode() if mode is None else mode
        self.type_id, self.blocks = weight.type_id, weight.blocks.contiguous()
        if self.out_features % 8 == 0:  # each expert's rows whole chunks of an interleaved layout
            self.type_id, self.blocks = kernel_layout(self.ops, self.mode, self.type_id, self.blocks)
        self.per_expert = self.blocks.split(self.out_features)  # views, made once

    def forward(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        return self.ops.quant_linear(x, self.per_expert[expert], self.type_id, None, self.mode)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.weight_type}"


class Experts(nn.Module):
    """The routed experts: gate and up fused into one [2I x hidden] projection per expert, then down."""

    def __init__(self, num_experts: int, hidden_size: int, expert_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj: nn.Module = ExpertLinear(num_experts, 2 * expert_size, hidden_size)
        self.down_proj: nn.Module = ExpertLinear(num_experts, hidden_size, expert_size)
        self.ops: LayerOps = TORCH_LAYER_OPS  # the model sets its choice (use_fused_ops)
        self.fused = True  # quantized experts run as one C++ op (False: the torch-ops form, for A/B)

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, hidden]; experts, weights [T, k] (ids and router weights, weights in x's dtype)
        -> sum over each token's k experts of weight * expert(x) [T, hidden]."""
        gate_up, down = self.gate_up_proj, self.down_proj
        if isinstance(gate_up, QuantExpertLinear) and isinstance(down, QuantExpertLinear) and self.fused:
            # One C++ call (kernels/cpu/moe_experts.cpp): the grouping, the products, the weighted sum.
            return gate_up.ops.moe_experts(
                x,
                experts,
                weights,
                gate_up.blocks,
                gate_up.type_id,
                down.blocks,
                down.type_id,
                self.num_experts,
                gate_up.mode,
            )
        return self.grouped(x, experts, weights)

    def grouped(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """forward, in torch ops: grouped by a stable sort, one product per projection per expert."""
        top_k = experts.shape[1]
        flat = experts.reshape(-1)
        order = flat.argsort(stable=True)  # (token, k) pairs grouped by expert, tokens ascending
        tokens = order.div(top_k, rounding_mode="floor")
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        hit = [(expert, count) for expert, count in enumerate(counts) if count]
        groups = x.index_select(0, tokens).split([count for _, count in hit])
        outs = [
            self.down_proj.forward(expert, self.ops.silu_and_mul(self.gate_up_proj.forward(expert, rows)))
            for (expert, _), rows in zip(hit, groups, strict=True)
        ]
        out_rows = torch.cat(outs) if len(outs) > 1 else outs[0]
        out_rows.mul_(weights.reshape(-1, 1).index_select(0, order))
        return torch.zeros_like(x).index_add_(0, tokens, out_rows)


class SparseMoeBlock(nn.Module):
    def __init__(self, hidden_size: int, moe: MoeConfig) -> None:
        super().__init__()
        self.top_k, self.normalize_top_k = moe.top_k, moe.normalize_top_k
        self.gate = Router(hidden_size, moe.num_experts)
        self.experts = Experts(moe.num_experts, hidden_size, moe.expert_size)
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if moe.shared_expert_size:
            self.shared_expert = GatedMLP(hidden_size, moe.shared_expert_size)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    @property
    def ops(self) -> LayerOps:
        return self.experts.ops

    @ops.setter
    def ops(self, ops: LayerOps) -> None:
        self.experts.ops = ops
        if self.shared_expert is not None:
            self.shared_expert.ops = ops

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (expert ids [T, k] int64, their weights [T, k] in x's dtype)."""
        return self.ops.moe_route(x, self.gate.weight, self.top_k, self.normalize_top_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts, weights = self.route(x)
        out = self.experts.forward(x, experts, weights)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            shared = self.shared_expert.forward(x)
            out += torch.sigmoid(self.shared_expert_gate.forward(x)) * shared
        return out
