"""The Llama decoder (and its close kin Mistral, Qwen2, Qwen3; the base of Gemma and Phi-3) over a
paged KV cache.

One forward takes every scheduled token of every request packed into one flat batch
(`input_ids [T]`, `positions [T]`) and returns hidden states [T, hidden]; logits are computed
separately, only for the rows that sample. The projections that read the same input are fused
(q/k/v into one matrix, gate/up into another): one GEMM each instead of three and two.

Inside the layer stack, modules are called through `.forward`, not `__call__`: nn.Module's hook
bookkeeping costs about a microsecond a hop, a decode step makes ~7 hops per layer, and nothing here
registers hooks.

Per layer, attention may slide over a window (Mistral, Qwen2/3 with `use_sliding_window`, Gemma,
Phi-3): each Attention carries its layer's rules and every backend applies them exactly. Layers that
slide may rotate with their own rotary (Gemma 3's local base): `sliding_rotary`. Options a family
sets through its config (models/registry.py): the embedding scale, the final logit softcap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import structlog
import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.kernels.attention import AttentionBackend, AttentionMetadata
from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, LayerOps, layer_ops_for
from pagedserve.services.worker.layers.attention import Attention
from pagedserve.services.worker.layers.fused_layer import FusedLayer, fuse_layer
from pagedserve.services.worker.layers.mlp import GatedMLP
from pagedserve.services.worker.layers.norm import RMSNorm
from pagedserve.services.worker.layers.packed_linear import pack_linear, prepack_linears
from pagedserve.services.worker.layers.rope import RotaryEmbedding
from pagedserve.services.worker.layers.softcap import soft_cap

if TYPE_CHECKING:
    from pagedserve.services.worker.layers.lora import LoRABatch
    from pagedserve.services.worker.layers.quant_linear import QuantEmbedding
    from pagedserve.services.worker.models.registry import ModelConfig

KVCaches = Sequence[tuple[torch.Tensor, torch.Tensor]]  # per layer (k_cache, v_cache)
Rows = slice | tuple[int | slice, ...] | None  # the part of a parameter a checkpoint tensor fills


def unchanged(x: torch.Tensor) -> torch.Tensor:
    return x


def hidden_norm(cfg: ModelConfig) -> RMSNorm:
    """A norm of the hidden state, by the family's config (Gemma's multiply by 1 + w)."""
    return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, unit_offset=cfg.norm_unit_offset)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, layer: int, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = hidden_norm(cfg)
        self.self_attn = Attention(cfg, backend, layer)
        self.post_attention_layernorm = hidden_norm(cfg)
        self.mlp = mlp
        # Under tensor parallelism each sub-layer's output is this rank's partial sum (its heads, its
        # MLP columns): the all-reduce that adds them up (tensor_parallel/shard.py); alone, nothing.
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = unchanged
        self.fused: FusedLayer | None = None  # this layer as one C++ call, where it qualifies (use_fused)

    def use_fused(self) -> str | None:
        """Run this layer as one C++ call where all of its parts allow (layers/fused_layer.py)
        -> None if it now does, else why not."""
        self.fused = None
        if self.reduce is not unchanged:
            return "a tensor-parallel rank's layer"
        fused = self.fuse()
        if isinstance(fused, str):
            return fused
        self.fused = fused
        return None

    def fuse(self) -> FusedLayer | str:
        """This layer's parts as the fused op takes them (a family with its own layer says how)."""
        if type(self) is not LlamaDecoderLayer:
            return "a family's own layer"
        return fuse_layer(self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp)

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
        """-> (this layer's MLP output, the residual stream without it).

        The residual stream is carried, not summed here: the next norm adds it to x in the same
        op (one fused kernel on the CPU), the first layer's norm has nothing to add yet."""
        if self.fused is not None and self.fused.takes_this_step():
            return self.fused(x, residual, cos, sin, k_cache, v_cache, meta)
        if residual is None:
            x, residual = self.input_layernorm.forward(x), x
        else:
            x, residual = self.input_layernorm.add_and_norm(x, residual)
        attended = self.reduce(self.self_attn.forward(x, cos, sin, k_cache, v_cache, meta))
        return self.feed_forward(attended, residual)

    def feed_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention's output -> (the MLP's output, the residual stream without it)."""
        x, residual = self.post_attention_layernorm.add_and_norm(x, residual)
        return self.reduce(self.mlp.forward(x)), residual


class LlamaForCausalLM(nn.Module):
    decoder_layer: ClassVar[type[nn.Module]] = LlamaDecoderLayer
    # Checkpoint projections that live inside one of our fused matrices: name -> (ours, shard index).
    fused_projections: ClassVar[dict[str, tuple[str, int]]] = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = cfg
        # Given its (empty) weight, nn.Embedding skips its random init: on the meta device that init
        # runs torch's Python decompositions, which import torch._dynamo and triton (~150 MiB of RSS).
        # A GGUF's quantized embedding replaces it (weights/quant_install.py), and brings the tied head.
        self.embed_tokens: nn.Embedding | QuantEmbedding = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size)
        )
        self.layers = nn.ModuleList(
            self.decoder_layer(cfg, backend, i, self.make_mlp(cfg, i)) for i in range(cfg.num_layers)
        )
        self.norm = hidden_norm(cfg)
        self.lm_head = (
            None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        )
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim, cfg.max_position_embeddings)
        self.sliding_rotary = (
            None
            if cfg.sliding_rope is None
            else RotaryEmbedding(cfg.sliding_rope, cfg.head_dim, cfg.max_position_embeddings)
        )
        # Per layer: whether it takes the sliding layers' rotary.
        self.slides = [cfg.window(i) is not None for i in range(cfg.num_layers)]
        self.tied_head: nn.Module | None = None  # the embedding packed for the LM head, once prepacked
        self.layer_ops: LayerOps | None = None  # chosen once the weights' device is real
        # How many layers run as one C++ call each (use_fused_layers); None: decided at the next forward,
        # once the weights, adapters and ranks are all in place.
        self.fused_layers: int | None = None
        self.fusing = True  # use_fused_layers' last choice, kept when the model decides again
        self.lora: LoRABatch | None = None  # the adapters' rows per step, once install_lora_linears ran
        self.fused_lora_version = 0  # the adapters' stacks the fused layers hold (LoRABatch.version)

    @staticmethod
    def make_mlp(cfg: ModelConfig, layer: int) -> nn.Module:
        """Layer `layer`'s MLP (a subclass's architecture may vary it by layer)."""
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act)

    def to_empty(self, *, device: torch.device | str | int | None, recurse: bool = True) -> LlamaForCausalLM:
        # nn.Module.to_empty's empty_like of a meta tensor runs torch's Python reference, which
        # imports sympy (~35 MiB of RSS); torch.empty of the same shape and dtype does not.
        self._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device), recurse=recurse)
        # Built on the meta device, the model learns its device here: build the fused kernels now
        # (~30 s the first time on a machine), not inside the first step.
        self.use_fused_ops()
        return self

    def use_fused_ops(self, enabled: bool = True) -> str:
        """Run the per-layer norms, residual adds, SiLU-and-mul and rotary embedding as our fused C++
        kernels where they apply (CPU, float32 / bfloat16, buildable here), else (or `enabled=False`) as plain torch ops;
        -> the name of the ops chosen."""
        weight = self.norm.weight  # a dense parameter of the model's dtype, whatever the embedding holds
        ops = layer_ops_for(weight.dtype, weight.device) if enabled else TORCH_LAYER_OPS
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, GatedMLP)):
                module.ops = ops
        self.layer_ops = ops
        self.fused_layers = None
        return ops.name

    def use_fused_layers(self, enabled: bool = True) -> int:
        """Run each decoder layer that qualifies as one C++ call (layers/fused_layer.py), or none
        (`enabled=False`, for A/B runs) -> how many do. Logs why the first layer left out was."""
        self.fusing = enabled
        reasons: list[str | None] = []
        for layer in self.layers:
            assert isinstance(layer, LlamaDecoderLayer)  # every family's layer is one
            layer.fused = None
            reasons.append(layer.use_fused() if enabled else "turned off")
        self.fused_layers = reasons.count(None)
        self.fused_lora_version = 0 if self.lora is None else self.lora.version
        left_out = next((reason for reason in reasons if reason is not None), None)
        structlog.get_logger("pagedserve.worker").info(
            "decoder_layers_fused", fused=self.fused_layers, layers=len(reasons), left_out_because=left_out
        )
        return self.fused_layers

    def use_all_reduce(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """A tensor-parallel rank's model: every decoder layer sums its sub-layers' partial outputs."""
        for layer in self.layers:
            assert isinstance(layer, LlamaDecoderLayer)  # every family's layer is one
            layer.reduce = reduce
        self.fused_layers = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: KVCaches,
        meta: AttentionMetadata,
        long_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Packed tokens -> final (normalised) hidden states [T, hidden]; writes this step's K/V.
        long_tokens [T] bool: the tokens a LongRoPE model rotates with its long factors (rope.py)."""
        if self.layer_ops is None:
            self.use_fused_ops()
        if self.fused_layers is None or (
            self.lora is not None and self.lora.version != self.fused_lora_version
        ):
            self.use_fused_layers(self.fusing)
        x = self.embed_tokens(input_ids)
        if self.config.embed_scale is not None:
            # In the model dtype, as transformers scales (sqrt(3072) is 55.5 in bfloat16, not 55.43).
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        rotation = self.rotary.cos_sin(positions, x.dtype, long_tokens)
        sliding = rotation if self.sliding_rotary is None else self.sliding_rotary.cos_sin(positions, x.dtype)
        residual = None
        for layer, slides, (k_cache, v_cache) in zip(self.layers, self.slides, kv_caches, strict=True):
            cos, sin = sliding if slides else rotation
            x, residual = layer.forward(x, residual, cos, sin, k_cache, v_cache, meta)
        return self.norm(x) if residual is None else self.norm.add_and_norm(x, residual)[0]

    def weights_loaded(self, offset_stored: bool = False) -> None:
        """The loader has filled every weight: norms whose checkpoint stores w for 1 + w fold the 1 in
        (offset_stored: the weights came with the 1 added, as in a converted Gemma GGUF)."""
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.fold_unit_offset(offset_stored)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] of the rows that sample -> logits [N, vocab] (soft-capped where the model is)."""
        if self.lm_head is not None:
            logits = self.lm_head(hidden)
        elif self.tied_head is not None:
            logits = self.tied_head(hidden)
        else:
            assert isinstance(self.embed_tokens, nn.Embedding)  # a quantized one set tied_head
            logits = F.linear(hidden, self.embed_tokens.weight)
        cap = self.config.final_logit_softcap
        return logits if cap is None else soft_cap(logits, cap)

    def prepack_weights(self) -> int:
        """Pack every projection and the LM head for the CPU GEMM library, once, after loading;
        -> how many were packed (0: not available for this dtype or device, the model is unchanged)."""
        count = prepack_linears(self)
        if self.lm_head is None and self.tied_head is None:  # a quantized embedding brings its own head
            # Tied: the embedding stays dense for its lookups; the head gets a packed copy.
            assert isinstance(self.embed_tokens, nn.Embedding)  # a quantized one set tied_head
            self.tied_head = pack_linear(self.embed_tokens.weight)
            count += self.tied_head is not None
        return count

    def checkpoint_target(self, hf_name: str) -> tuple[str, Rows] | None:
        """A checkpoint tensor's name -> (our parameter, the part it fills: rows, or an index such as
        (expert, rows) into a 3-D parameter; None = all of it).

        None: a tensor the checkpoint may carry that we do not use. KeyError: a tensor we do not know.
        """
        name = hf_name.removeprefix("model.")
        if name.endswith("rotary_emb.inv_freq"):
            return None  # recomputed from the config
        if name == "lm_head.weight" and self.lm_head is None:
            return None  # tied: some checkpoints store the copy anyway
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in self.fused_projections:
            fused, shard = self.fused_projections[parts[-2]]
            target = ".".join([*parts[:-2], fused, parts[-1]])
            return target, self._shard_rows(fused, shard)
        return name, None

    def checkpoint_names_filled_by(self, hf_name: str) -> tuple[str, ...]:
        """The names of checkpoint_names() a tensor of this name fills (more than itself: a MoE's)."""
        return (hf_name,)

    def checkpoint_names(self) -> list[str]:
        """Every checkpoint tensor this model needs, by its Hugging Face name."""
        split = {v: k for k, v in self.fused_projections.items()}
        names = []
        for name, _ in self.named_parameters():
            parts = name.split(".")
            fused = parts[-2] if len(parts) >= 2 else ""
            prefix = "" if name.startswith("lm_head.") else "model."
            if (fused, 0) in split:  # a matrix the checkpoint stores in parts
                shards = 3 if fused == "qkv_proj" else 2
                for shard in range(shards):
                    names.append(prefix + ".".join([*parts[:-2], split[(fused, shard)], parts[-1]]))
            else:
                names.append(prefix + name)
        return names

    def _shard_rows(self, fused: str, shard: int, size: int | None = None) -> slice:
        """The rows of shard `shard` in fused projection `fused`; size: gate_up's intermediate size,
        where not the config's (a MoE's shared expert)."""
        cfg = self.config
        if fused == "gate_up_proj":
            size = size or cfg.intermediate_size
            return slice(shard * size, (shard + 1) * size)
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        starts = (0, q, q + kv, q + 2 * kv)
        return slice(starts[shard], starts[shard + 1])
