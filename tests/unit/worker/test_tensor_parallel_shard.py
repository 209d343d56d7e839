"""What a tensor-parallel rank keeps of a model: its heads and MLP columns, the rest whole; the ranks'
parts put back together are the checkpoint's tensor; and what cannot be split is refused naming why."""

from __future__ import annotations

import pytest
import torch

from pagedserve import LLM
from pagedserve.services.worker.models.registry import ModelConfig, parse_config
from pagedserve.services.worker.tensor_parallel import GroupRefused
from pagedserve.services.worker.tensor_parallel.shard import RankShard
from pagedserve.shared.config import config_of


def config(**fields) -> ModelConfig:
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 4,
    }
    return parse_config(hf | fields)


def parts(name: str, tensor: torch.Tensor, cfg: ModelConfig, size: int = 2) -> list[torch.Tensor]:
    return [RankShard(rank, size).rank_part(name, tensor, cfg) for rank in range(size)]


def test_a_rank_holds_its_share_of_the_heads_and_of_the_mlp():
    local = RankShard(1, 2).local_config(config())
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (2, 1, 12)
    assert (local.hidden_size, local.vocab_size, local.head_dim) == (16, 32, 4)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"num_attention_heads": 6, "num_key_value_heads": 3}, "num_key_value_heads \\(3\\)"),
        ({"intermediate_size": 25}, "intermediate_size \\(25\\)"),
    ],
)
def test_a_dimension_that_does_not_divide_is_refused_by_name(fields, named):
    with pytest.raises(GroupRefused, match=named + " does not divide by tensor_parallel_size \\(2\\)"):
        RankShard(0, 2).local_config(config(**fields))


def test_column_parallel_rows_and_row_parallel_columns_put_back_together_are_the_whole():
    cfg = config()
    q = torch.randn(16, 16)
    assert torch.equal(torch.cat(parts("model.layers.0.self_attn.q_proj.weight", q, cfg)), q)
    assert parts("model.layers.0.self_attn.q_proj.weight", q, cfg)[1].shape == (8, 16)  # heads 2, 3
    down = torch.randn(16, 24)
    assert torch.equal(torch.cat(parts("model.layers.0.mlp.down_proj.weight", down, cfg), dim=1), down)
    experts = torch.randn(5, 24, 16)  # a GGUF's whole-layer [experts, out, in]
    got = parts("model.layers.0.mlp.experts.gate_proj.weight", experts, cfg)
    assert torch.equal(torch.cat(got, dim=1), experts)


def test_a_row_parallel_bias_is_added_once():
    bias = torch.randn(16)
    got = parts("model.layers.0.self_attn.o_proj.bias", bias, config())
    assert torch.equal(sum(got), bias) and not got[1].any()


def test_replicated_tensors_stay_whole():
    cfg = config()
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.gate.weight"):
        tensor = torch.randn(32, 16)
        assert all(p is tensor for p in parts(name, tensor, cfg)), name


def test_a_fused_checkpoint_projection_is_cut_piece_by_piece():
    """Phi-3 stores [q | k | v]: each rank takes its q heads, its k heads and its v heads."""
    cfg = config()
    q, k, v = torch.randn(16, 16), torch.randn(8, 16), torch.randn(8, 16)
    got = parts("model.layers.0.self_attn.qkv_proj.weight", torch.cat([q, k, v]), cfg)
    assert torch.equal(got[1], torch.cat([q[8:], k[4:], v[4:]]))


def test_what_a_group_does_not_run_is_refused_at_start_by_name():
    with pytest.raises(ValueError, match="does not run LoRA adapters"):
        config_of(tensor_parallel_size=2, max_loras=2)
    with pytest.raises(ValueError, match="quantization 'gguf' is not supported"):
        config_of(tensor_parallel_size=2, quantization="gguf")
    with pytest.raises(ValueError, match="speculative decoding"):
        config_of(tensor_parallel_size=2, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="needs a deployment"):
        LLM("unused", tensor_parallel_size=2)


def test_whole_projection_qk_norms_are_refused():
    olmoe = config(architectures=["OlmoeForCausalLM"], hidden_size=16, num_experts=4, num_experts_per_tok=2)
    with pytest.raises(GroupRefused, match="whole projection"):
        RankShard(0, 2).local_config(olmoe)
