"""The sparse MoE block on its own: routing as each config says, expert grouping against a plain
per-token loop, and the registry's reading of MoE configs (which layers are sparse, clear errors)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels.layer_ops import TORCH_LAYER_OPS, layer_ops_for
from pagedserve.services.worker.layers.moe import MoeConfig, SparseMoeBlock
from pagedserve.services.worker.models.registry import parse_config

HIDDEN, EXPERTS, SIZE = 48, 7, 40


def _block(top_k: int, normalize: bool, shared: int = 0, seed: int = 0) -> SparseMoeBlock:
    torch.manual_seed(seed)
    config = MoeConfig(EXPERTS, top_k, SIZE, normalize, shared, frozenset({0}))
    block = SparseMoeBlock(HIDDEN, config)
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0, 0.3)
    return block


def _per_token(block: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    """The definition, one token and one expert at a time."""
    probs = torch.softmax(x @ block.gate.weight.T, dim=-1)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        weights, ids = probs[t].topk(block.top_k)
        if block.normalize_top_k:
            weights = weights / weights.sum()
        for w, e in zip(weights.tolist(), ids.tolist(), strict=True):
            gate_up = block.experts.gate_up_proj.weight[e]
            gate, up = (x[t] @ gate_up.T).chunk(2)
            out[t] += w * (block.experts.down_proj.weight[e] @ (F.silu(gate) * up))
        if block.shared_expert is not None:
            shared = block.shared_expert.forward(x[t : t + 1])[0]
            out[t] += torch.sigmoid(x[t] @ block.shared_expert_gate.weight[0]) * shared
    return out


@pytest.mark.parametrize(
    ("top_k", "normalize", "shared"), [(3, True, 0), (3, False, 24), (1, False, 0), (7, True, 0)]
)
@pytest.mark.parametrize("tokens", [1, 2, 13])
def test_grouped_experts_equal_the_per_token_definition(top_k, normalize, shared, tokens):
    block = _block(top_k, normalize, shared)
    x = torch.randn(tokens, HIDDEN)
    with torch.inference_mode():
        torch.testing.assert_close(block(x), _per_token(block, x), rtol=1e-5, atol=1e-5)


def test_the_fused_cpp_ops_give_the_torch_ops_result():
    block = _block(3, True, 24)
    x = torch.randn(11, HIDDEN)
    with torch.inference_mode():
        expected = block(x)
        block.ops = layer_ops_for(torch.float32, torch.device("cpu"))
        assert block.ops is not TORCH_LAYER_OPS and block.shared_expert.ops is block.ops
        torch.testing.assert_close(block(x), expected, rtol=1e-6, atol=1e-6)


def test_routing_renormalises_only_when_asked():
    x = torch.randn(5, HIDDEN)
    with torch.inference_mode():
        _, raw = _block(3, False).route(x)
        ids, normalized = _block(3, True).route(x)
    assert ids.shape == (5, 3) and ids.dtype == torch.int64
    assert (raw.sum(-1) < 1).all()
    torch.testing.assert_close(normalized.sum(-1), torch.ones(5))
    torch.testing.assert_close(normalized, raw / raw.sum(-1, keepdim=True))


BASE = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 6,
    "intermediate_size": 96,
    "vocab_size": 10,
}


def test_sparse_layers_follow_mlp_only_layers_and_decoder_sparse_step():
    qwen = {**BASE, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "num_experts_per_tok": 2}
    qwen["moe_intermediate_size"] = 32
    assert parse_config(qwen).moe.sparse_layers == set(range(6))
    assert parse_config({**qwen, "decoder_sparse_step": 2}).moe.sparse_layers == {1, 3, 5}
    assert parse_config({**qwen, "decoder_sparse_step": 2, "mlp_only_layers": [3]}).moe.sparse_layers == {
        1,
        5,
    }
    assert parse_config({**qwen, "num_local_experts": 8, "num_experts": None}).moe.num_experts == 8
    assert parse_config({**qwen, "num_experts": 0}).moe.sparse_layers == set()  # all dense
    moe = parse_config({**qwen, "norm_topk_prob": True}).moe
    assert moe.normalize_top_k and moe.expert_size == 32 and moe.shared_expert_size == 0


def test_each_architecture_reads_its_own_keys():
    mixtral = parse_config(
        {**BASE, "architectures": ["MixtralForCausalLM"], "num_local_experts": 5, "num_experts_per_tok": 2}
    )
    assert (
        mixtral.moe.normalize_top_k and mixtral.moe.expert_size == 96 and len(mixtral.moe.sparse_layers) == 6
    )
    olmoe = parse_config(
        {
            **BASE,
            "architectures": ["OlmoeForCausalLM"],
            "num_experts": 5,
            "num_experts_per_tok": 2,
            "clip_qkv": 8,
        }
    )
    assert not olmoe.moe.normalize_top_k and olmoe.qk_norm_full and olmoe.clip_qkv == 8.0
    qwen2 = {**BASE, "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 5, "num_experts_per_tok": 2}
    qwen2 |= {"moe_intermediate_size": 16, "shared_expert_intermediate_size": 48}
    parsed = parse_config(qwen2)
    assert parsed.moe.shared_expert_size == 48 and parsed.qkv_bias and not parsed.o_bias  # qkv_bias: True
    assert not parse_config({**qwen2, "qkv_bias": False}).qkv_bias


def test_bad_moe_configs_are_refused_by_field():
    qwen = {**BASE, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4, "moe_intermediate_size": 32}
    with pytest.raises(ValueError, match=r"num_experts_per_tok must be in \[1, num_experts=4\]; got 5"):
        parse_config({**qwen, "num_experts_per_tok": 5})
    with pytest.raises(ValueError, match="decoder_sparse_step must be >= 1"):
        parse_config({**qwen, "num_experts_per_tok": 2, "decoder_sparse_step": -1})
    with pytest.raises(ValueError, match="clip_qkv is not supported for Qwen3MoeForCausalLM"):
        parse_config({**qwen, "num_experts_per_tok": 2, "clip_qkv": 4})
    with pytest.raises(ValueError, match="num_attention_heads \\* head_dim"):
        parse_config(
            {
                **BASE,
                "architectures": ["OlmoeForCausalLM"],
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "head_dim": 8,
            }
        )


def test_a_layers_experts_load_from_one_3d_tensor_per_projection(tiny_model, tmp_path):
    """`mlp.experts.<proj>.weight` [experts, out, in] (the GGUF's stacked form, named as read from one)
    fills every expert, as the per-expert tensors do."""
    import shutil

    from safetensors.torch import load_file, save_file

    from pagedserve.kernels.torch_backend import TorchAttentionBackend
    from pagedserve.services.worker.weights.loader import load_model

    source = tiny_model("mixtral")
    folder = tmp_path / "stacked"
    shutil.copytree(source, folder)
    tensors = load_file(folder / "model.safetensors")
    stacked = {}
    for layer in range(2):
        for mixtral, ours in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            names = [f"model.layers.{layer}.block_sparse_moe.experts.{e}.{mixtral}.weight" for e in range(5)]
            stacked[f"model.layers.{layer}.mlp.experts.{ours}.weight"] = torch.stack(
                [tensors.pop(n) for n in names]
            )
    save_file({**tensors, **stacked}, folder / "model.safetensors", metadata={"format": "pt"})
    expected = load_model(source, TorchAttentionBackend()).model
    got = load_model(folder, TorchAttentionBackend()).model
    for (name, a), (_, b) in zip(expected.named_parameters(), got.named_parameters(), strict=True):
        assert torch.equal(a, b), name
