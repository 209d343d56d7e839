"""Gemma 2 and Gemma 3 (text): the Llama decoder with four norms a layer.

Each sub-layer's output is normalised before it joins the residual stream (post_attention_layernorm,
post_feedforward_layernorm), besides the usual norm of its input (input_layernorm,
pre_feedforward_layernorm). The rest is configuration the shared code reads (models/registry.py):
norms that multiply by 1 + w, embeddings scaled by sqrt(hidden_size), GELU-tanh, query_pre_attn_scalar,
sliding-window layers interleaved with global ones, soft-capped attention (Gemma 2) and final logits,
per-head q/k norms and a local rotary base for the sliding layers (Gemma 3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from pagedserve.kernels.attention import AttentionBackend, AttentionMetadata
from pagedserve.services.worker.layers.attention import Attention
from pagedserve.services.worker.layers.norm import RMSNorm
from pagedserve.services.worker.models.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from pagedserve.services.worker.models.registry import ModelConfig


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, layer: int, mlp: nn.Module) -> None:
        super().__init__()

        def norm() -> RMSNorm:
            return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=cfg.norm_unit_offset)

        self.input_layernorm = norm()
        self.self_attn = Attention(cfg, backend, layer)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.mlp = mlp
        self.post_feedforward_layernorm = norm()

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (this layer's normalised MLP output, the residual stream without it): as in Llama, the
        next norm adds the two in one fused op."""
        if residual is None:
            x, residual = self.input_layernorm.forward(x), x
        else:
            x, residual = self.input_layernorm.add_and_norm(x, residual)
        x = self.post_attention_layernorm.forward(self.self_attn.forward(x, cos, sin, k_cache, v_cache, meta))
        x, residual = self.pre_feedforward_layernorm.add_and_norm(x, residual)
        return self.post_feedforward_layernorm.forward(self.mlp.forward(x)), residual


class GemmaForCausalLM(LlamaForCausalLM):
    decoder_layer: ClassVar[type[nn.Module]] = GemmaDecoderLayer
