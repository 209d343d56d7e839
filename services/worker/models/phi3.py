"""Phi-3 and Phi-4 (Phi3ForCausalLM): the Llama decoder, whose checkpoints already hold q/k/v in one
`qkv_proj` and gate/up in one `gate_up_proj`, in our fused matrices' row order ([q | k | v],
[gate | up]): each loads whole, with nothing to split. LongRoPE and the partial rotary (Phi-4-mini) are
the rotary's (layers/rope.py); the sliding window (Phi-3-mini's 2047) the attention's."""

from __future__ import annotations

from typing import ClassVar

from pagedserve.services.worker.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    fused_projections: ClassVar[dict[str, tuple[str, int]]] = {}  # the checkpoint's are ours
