"""Self-attention over the paged KV cache: fused q/k/v projection, optional q/k norms (per head, as
Qwen3 and Gemma 3 do, or over the whole projection, as OLMoE does), optional q/k/v clipping (OLMoE's
clip_qkv), rotary embedding (of the first rotary_dim dimensions of each head: all of them, or a part),
the K/V write through the slot mapping, and the attention backend's kernel under this layer's rules
(its sliding window, its logit softcap)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.kernels.attention import AttentionBackend, AttentionMetadata, AttentionRules
from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, LayerOps
from pagedserve.services.worker.layers.norm import RMSNorm

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
        # Per head: one [head_dim] weight shared by every head; full: one weight over all of q (of k).
        self.qk_norm_full = cfg.qk_norm and cfg.qk_norm_full
        q_norm_dim, k_norm_dim = (self.q_size, self.kv_size) if self.qk_norm_full else (cfg.head_dim,) * 2
        self.q_norm = RMSNorm(q_norm_dim, cfg.rms_norm_eps, unit_offset=offset) if cfg.qk_norm else None
        self.k_norm = RMSNorm(k_norm_dim, cfg.rms_norm_eps, unit_offset=offset) if cfg.qk_norm else None
        self.clip_qkv = cfg.clip_qkv  # only with full q/k norms (the registry refuses it elsewhere)
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
        qkv = self.qkv_proj.forward(x)
        if self.qk_norm_full:
            q, k, v = self._full_norm(qkv, num_tokens)
            self.ops.rotary_(q, cos, sin)
            self.ops.rotary_(k, cos, sin)
            self.backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            out = self.backend.forward(q, k_cache, v_cache, meta, self.scale, self.rules)
            return self.o_proj.forward(out.view(num_tokens, self.q_size))
        heads = qkv.view(num_tokens, -1, self.head_dim)  # q, k and v heads side by side
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

    def _full_norm(
        self, qkv: torch.Tensor, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """OLMoE: q and k each normalised over the whole projection, then all three clipped (clip_qkv)
        -> q, k, v as heads."""
        assert self.q_norm is not None and self.k_norm is not None
        q_rows, k_rows, v_rows = qkv.split_with_sizes([self.q_size, self.kv_size, self.kv_size], dim=1)
        q, k = self.q_norm.forward(q_rows), self.k_norm.forward(k_rows)  # new contiguous tensors
        if self.clip_qkv is not None:
            q.clamp_(-self.clip_qkv, self.clip_qkv)
            k.clamp_(-self.clip_qkv, self.clip_qkv)
            v_rows = v_rows.clamp(-self.clip_qkv, self.clip_qkv)
        shape = (num_tokens, -1, self.head_dim)
        return q.view(shape), k.view(shape), v_rows.reshape(shape)
