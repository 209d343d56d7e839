"""Which part of the model a tensor-parallel rank holds: its heads and its columns of every MLP.

Megatron's split. Column-parallel: q/k/v and gate/up keep the rank's output rows (its heads, its slice
of the intermediate size); row-parallel: o_proj and down_proj keep the matching input columns, and the
partial sums of all ranks are added by one all-reduce after each sub-layer (models/llama.py). A MoE
splits every expert's intermediate size the same way (the router stays whole: each rank routes the
same tokens alike). Embeddings, the LM head and the norms are replicated.

A rank's model is the same model class built from a smaller config (`local_config`), so the layers
need no parallel variant; the loader cuts each checkpoint tensor to the rank's part before it is
copied in (`rank_part`), so no parameter ever holds what another rank computes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from pagedserve.services.worker.models.registry import ModelConfig
from pagedserve.services.worker.tensor_parallel import GroupRefused

# Checkpoint projections by how they split (their name before `.weight` / `.bias`); Mixtral's w1/w3/w2.
COLUMN_PARALLEL = frozenset({"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1", "w3"})
ROW_PARALLEL = frozenset({"o_proj", "down_proj", "w2"})


@dataclass(frozen=True, slots=True)
class RankShard:
    rank: int
    size: int

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The config of this rank's part: heads, kv heads and MLP sizes divided by the group's size;
        GroupRefused naming the dimension that does not divide."""
        dims = {
            "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads,
            "intermediate_size": cfg.intermediate_size,
        }
        if cfg.moe is not None:
            dims["moe expert intermediate size"] = cfg.moe.expert_size
            dims["shared_expert_intermediate_size"] = cfg.moe.shared_expert_size
        for name, value in dims.items():
            if value % self.size:
                raise GroupRefused(
                    f"{cfg.architecture}: {name} ({value}) does not divide by tensor_parallel_size ({self.size})"
                )
        if cfg.qk_norm_full:
            raise GroupRefused(
                f"{cfg.architecture} normalises q and k over the whole projection, which tensor "
                "parallelism splits across ranks: tensor_parallel_size must be 1"
            )
        moe = cfg.moe
        if moe is not None:
            moe = dataclasses.replace(
                moe,
                expert_size=moe.expert_size // self.size,
                shared_expert_size=moe.shared_expert_size // self.size,
            )
        return dataclasses.replace(
            cfg,
            num_heads=cfg.num_heads // self.size,
            num_kv_heads=cfg.num_kv_heads // self.size,
            intermediate_size=cfg.intermediate_size // self.size,
            moe=moe,
        )

    def rank_part(self, name: str, tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        """A checkpoint tensor (by its Hugging Face name) -> the part this rank keeps. `cfg`: the whole
        model's config (Phi-3's fused checkpoint tensors are cut by its sizes)."""
        parts = name.split(".")
        if len(parts) < 2:
            return tensor
        projection, kind = parts[-2], parts[-1]
        # Output rows: dim 0 of a [out, in] weight or an [out] bias, dim 1 of a whole-layer expert
        # tensor [experts, out, in] (a GGUF's form).
        out_dim = -2 if tensor.dim() >= 2 else -1
        if projection in COLUMN_PARALLEL:
            return self._mine(tensor, out_dim)
        if projection in ROW_PARALLEL:
            if kind == "bias":
                # Added once to the sum of the ranks' partial outputs: rank 0 adds it, the others add 0.
                return tensor if self.rank == 0 else torch.zeros_like(tensor)
            return self._mine(tensor, -1)
        fused = _fused_sizes(projection, cfg)
        if fused is not None:  # Phi-3 stores [q | k | v] and [gate | up] whole: cut each piece
            pieces = tensor.split(fused, dim=out_dim)
            return torch.cat([self._mine(piece, out_dim) for piece in pieces], dim=out_dim)
        return tensor  # replicated: embeddings, norms, the LM head, a MoE's router

    def _mine(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        return tensor.chunk(self.size, dim=dim)[self.rank]


def _fused_sizes(projection: str, cfg: ModelConfig) -> list[int] | None:
    if projection == "qkv_proj":
        kv = cfg.num_kv_heads * cfg.head_dim
        return [cfg.num_heads * cfg.head_dim, kv, kv]
    if projection == "gate_up_proj":
        return [cfg.intermediate_size, cfg.intermediate_size]
    return None
