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

from pagedserve.kernels.attention import AttentionBackend
from pagedserve.services.worker.layers.fused_layer import FusedLayer, fuse_layer
from pagedserve.services.worker.models.llama import LlamaDecoderLayer, LlamaForCausalLM, hidden_norm

if TYPE_CHECKING:
    from pagedserve.services.worker.models.registry import ModelConfig


class GemmaDecoderLayer(LlamaDecoderLayer):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, layer: int, mlp: nn.Module) -> None:
        super().__init__(cfg, backend, layer, mlp)
        self.pre_feedforward_layernorm = hidden_norm(cfg)
        self.post_feedforward_layernorm = hidden_norm(cfg)

    def fuse(self) -> FusedLayer | str:
        """The fused op's Gemma form: the attention's and the MLP's outputs normalised too."""
        out_norms = (self.post_attention_layernorm, self.post_feedforward_layernorm)
        return fuse_layer(
            self.input_layernorm, self.self_attn, self.pre_feedforward_layernorm, self.mlp, out_norms
        )

    def feed_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (the normalised MLP output, the residual stream without it): the attention's output is
        normalised before it joins the stream; as in Llama, the next norm adds the MLP's."""
        x, residual = self.pre_feedforward_layernorm.add_and_norm(
            self.post_attention_layernorm.forward(x), residual
        )
        return self.post_feedforward_layernorm.forward(self.reduce(self.mlp.forward(x))), residual


class GemmaForCausalLM(LlamaForCausalLM):
    decoder_layer: ClassVar[type[nn.Module]] = GemmaDecoderLayer
