"""Mixture-of-experts decoders: the Llama decoder whose MLP is a sparse MoE block in the layers the
config names (layers/moe.py), a dense gated MLP in the others.

Qwen2-MoE, Qwen3-MoE and OLMoE name their tensors alike (`mlp.gate` the router, `mlp.experts.E.
{gate,up,down}_proj` the experts, Qwen2-MoE's `mlp.shared_expert.*` and `mlp.shared_expert_gate`);
Mixtral calls the block `block_sparse_moe` and its experts' projections w1 (gate), w3 (up) and w2
(down). Our modules use the first spelling for all four. The experts of a layer are held as 3-D
tensors [num_experts, out, in], and each checkpoint tensor fills one expert's part of one of them.
Besides the per-expert names, a whole-layer name without the expert index
(`mlp.experts.gate_proj.weight`, [num_experts, out, in]) fills every expert at once: the form a GGUF
file stores (`blk.N.ffn_gate_exps`, weights/gguf_weights.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from pagedserve.services.worker.layers.mlp import GatedMLP
from pagedserve.services.worker.layers.moe import SparseMoeBlock
from pagedserve.services.worker.models.llama import LlamaForCausalLM, Rows

if TYPE_CHECKING:
    from pagedserve.services.worker.models.registry import ModelConfig

# Our names of an expert's projections -> (the fused 3-D parameter, the shard within it; None: all).
_EXPERT_PARTS: dict[str, tuple[str, int | None]] = {
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", None),
}


class MoeForCausalLM(LlamaForCausalLM):
    # How the checkpoint spells the MoE block and its experts' projections (see the module docstring).
    moe_block = "mlp"
    expert_parts = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}

    @staticmethod
    def make_mlp(cfg: ModelConfig, layer: int) -> nn.Module:
        if cfg.moe is not None and layer in cfg.moe.sparse_layers:
            return SparseMoeBlock(cfg.hidden_size, cfg.moe)
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act)

    def use_fused_ops(self, enabled: bool = True) -> str:
        name = super().use_fused_ops(enabled)
        ops = self.layer_ops
        assert ops is not None  # chosen by the call above
        for module in self.modules():
            if isinstance(module, SparseMoeBlock):
                module.ops = ops
        return name

    def checkpoint_target(self, hf_name: str) -> tuple[str, Rows] | None:
        parts = hf_name.removeprefix("model.").split(".")
        if len(parts) < 5 or parts[0] != "layers" or parts[2] not in ("mlp", self.moe_block):
            return super().checkpoint_target(hf_name)
        block, rest = f"layers.{parts[1]}.mlp", parts[3:]
        moe = self.config.moe
        assert moe is not None  # a MoE architecture's config always has its experts (registry.parse_moe)
        ours = {v: k for k, v in self.expert_parts.items()} | {k: k for k in _EXPERT_PARTS}
        if rest[0] == "experts" and rest[-1] == "weight" and rest[-2] in ours:
            # experts.E.<part>.weight (one expert) or experts.<part>.weight (all of them)
            expert: int | slice = int(rest[1]) if len(rest) == 4 else slice(None)
            fused, shard = _EXPERT_PARTS[ours[rest[-2]]]
            target = f"{block}.experts.{fused}.weight"
            if shard is None:
                return target, (expert,)
            return target, (expert, self._shard_rows(fused, shard, moe.expert_size))
        if rest == ["gate", "weight"]:
            return f"{block}.gate.weight", None
        if rest[0] == "shared_expert" and rest[1] in self.fused_projections:
            fused, shard = self.fused_projections[rest[1]]
            size = moe.shared_expert_size
            return f"{block}.shared_expert.{fused}.{rest[-1]}", self._shard_rows(fused, shard, size)
        return super().checkpoint_target(f"model.{block}.{'.'.join(rest)}")

    def checkpoint_names(self) -> list[str]:
        names = []
        for name in super().checkpoint_names():
            parts = name.split(".")  # model.layers.N.mlp.experts.<fused part>.weight
            if len(parts) == 7 and parts[4] == "experts":
                layer = int(parts[2])
                names += self.expert_checkpoint_names(layer, parts[5])
            elif len(parts) == 6 and parts[3] == "mlp" and parts[4] == "gate":
                names.append(f"model.layers.{parts[2]}.{self.moe_block}.gate.weight")
            else:
                names.append(name)
        return names

    def checkpoint_names_filled_by(self, hf_name: str) -> tuple[str, ...]:
        """A layer's whole 3-D expert tensor (`model.layers.N.mlp.experts.up_proj.weight`) fills every
        expert's tensor of that projection; a GGUF's router (`mlp.gate`, its name in every file) fills
        this architecture's (Mixtral's `block_sparse_moe.gate`)."""
        parts = hf_name.removeprefix("model.").split(".")
        if len(parts) == 6 and parts[0] == "layers" and parts[3] == "experts" and parts[4] in _EXPERT_PARTS:
            return tuple(self.expert_checkpoint_names(int(parts[1]), parts[4]))
        if len(parts) == 5 and parts[0] == "layers" and parts[2:] == ["mlp", "gate", "weight"]:
            return (f"model.layers.{parts[1]}.{self.moe_block}.gate.weight",)
        return (hf_name,)

    def expert_checkpoint_names(self, layer: int, part: str) -> list[str]:
        """Every expert's checkpoint tensor of one projection (`gate_proj`, `up_proj`, `down_proj`) of
        layer `layer`, as this architecture spells them."""
        experts = self.config.moe.num_experts if self.config.moe else 0
        spelled = self.expert_parts[part]
        return [f"model.layers.{layer}.{self.moe_block}.experts.{e}.{spelled}.weight" for e in range(experts)]


class MixtralForCausalLM(MoeForCausalLM):
    moe_block = "block_sparse_moe"
    expert_parts = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
