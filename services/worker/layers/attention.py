"""Self-attention over the paged KV cache: fused q/k/v projection, optional per-head q/k norms, rotary
embedding (of the first rotary_dim dimensions of each head: all of them, or a part), the K/V write
through the slot mapping, and the attention backend's kernel under this layer's rules (its sliding
window, its logit softcap)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pagedserve.kernels.attention import AttentionBackend, AttentionMetadata, AttentionRules
from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, LayerOps
from pagedserve.services.worker.layers.norm import RMSNorm
from torch import nn

if TYPE_CHECKING:
    from pagedserve.services.worker.models.registry import ModelConfig


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, layer: int = 0) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.scale
        self.rules = AttentionRules(window=cfg.window(layer), softcap=cfg.attn_logit_softcap)
        self.backend = backend
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        offset = cfg.norm_unit_offset
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, unit_offset=offset) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, unit_offset=offset) if cfg.qk_norm else None
        self.ops: LayerOps = TORCH_LAYER_OPS  # the model sets its choice (use_fused_ops)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        heads = self.qkv_proj.forward(x).view(num_tokens, -1, self.head_dim)  # q, k and v heads side by side
        # split_with_sizes: the op itself, without Tensor.split's Python layer (~3 us a call).
        q, k, v = heads.split_with_sizes([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        rotary_dim = 2 * cos.shape[-1]  # a partial rotary turns only the first rotary_dim of each head
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm.forward(q), self.k_norm.forward(k)
            self.ops.rotary_(q if rotary_dim == self.head_dim else q[..., :rotary_dim], cos, sin)
            self.ops.rotary_(k if rotary_dim == self.head_dim else k[..., :rotary_dim], cos, sin)
        else:
            # q and k are adjacent heads in each row: one in-place rotation covers both sets.
            qk = heads[:, : self.num_heads + self.num_kv_heads]
            self.ops.rotary_(qk if rotary_dim == self.head_dim else qk[..., :rotary_dim], cos, sin)
        self.backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = self.backend.forward(q, k_cache, v_cache, meta, self.scale, self.rules)
        return self.o_proj.forward(out.view(num_tokens, self.q_size))
