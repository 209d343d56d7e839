"""Reading Hugging Face checkpoint folders: configs, shards, names, dtypes, and clear refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedserve.kernels.torch_backend import TorchAttentionBackend
from pagedserve.services.worker.layers.rope import RopeConfig
from pagedserve.services.worker.models.registry import parse_config
from pagedserve.services.worker.weights.loader import checkpoint_files, load_model


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _load(path: Path, **kwargs):
    return load_model(path, TorchAttentionBackend(), **kwargs)


def test_sharded_checkpoint_loads_the_same_weights_as_a_single_file(tiny_model):
    single = _load(tiny_model("qwen2")).model
    sharded_path = tiny_model("qwen2", max_shard_size="40KB")
    assert (sharded_path / "model.safetensors.index.json").is_file()
    assert len(checkpoint_files(sharded_path)) > 1
    sharded = _load(sharded_path).model
    for (name, a), (_, b) in zip(single.state_dict().items(), sharded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_fused_projections_hold_the_checkpoint_rows_in_order(tiny_model):
    path = tiny_model("qwen2")
    weights = load_file(str(path / "model.safetensors"))
    model = _load(path).model
    attn = model.layers[1].self_attn
    expected = torch.cat([weights[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(attn.qkv_proj.weight, expected)
    expected_bias = torch.cat([weights[f"model.layers.1.self_attn.{p}_proj.bias"] for p in "qkv"])
    assert torch.equal(attn.qkv_proj.bias, expected_bias)
    gate_up = torch.cat([weights[f"model.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(model.layers[1].mlp.gate_up_proj.weight, gate_up)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_weights_are_converted_to_the_requested_dtype(tiny_model, dtype):
    model = _load(tiny_model("llama"), dtype=dtype).model
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}


def test_a_missing_weight_is_named(tiny_model, tmp_path):
    path = _copy(tiny_model("llama"), tmp_path / "m")
    weights = load_file(str(path / "model.safetensors"))
    del weights["model.layers.2.mlp.up_proj.weight"]
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks 1 tensors: model\.layers\.2\.mlp\.up_proj\.weight"):
        _load(path)


def test_an_unexpected_weight_is_named(tiny_model, tmp_path):
    path = _copy(tiny_model("llama"), tmp_path / "m")
    weights = load_file(str(path / "model.safetensors"))
    weights["model.layers.0.self_attn.mystery.weight"] = torch.zeros(2)
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected tensors: model\.layers\.0\.self_attn\.mystery\.weight"):
        _load(path)


def test_a_weight_of_the_wrong_shape_is_named(tiny_model, tmp_path):
    path = _copy(tiny_model("llama"), tmp_path / "m")
    weights = load_file(str(path / "model.safetensors"))
    weights["model.norm.weight"] = torch.ones(65)
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \(65,\)"):
        _load(path)


def test_an_unsupported_architecture_is_refused_by_name(tiny_model, tmp_path):
    path = _copy(tiny_model("llama"), tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        _load(path)


def test_a_folder_without_config_or_weights_is_refused(tiny_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        _load(tmp_path)
    path = _copy(tiny_model("llama"), tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        _load(path)


def test_eos_ids_are_config_and_generation_config_together(tiny_model, tmp_path):
    path = _copy(tiny_model("llama"), tmp_path / "m")
    assert _load(path).eos_token_ids == (2,)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7]}))
    assert _load(path).eos_token_ids == (2, 7)
    (path / "generation_config.json").unlink()
    assert _load(path).eos_token_ids == (2,)


def test_config_switches_per_architecture():
    base = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "intermediate_size": 8,
        "vocab_size": 10,
    }
    qwen3 = parse_config({**base, "architectures": ["Qwen3ForCausalLM"]})
    assert qwen3.head_dim == 128 and qwen3.qk_norm and not qwen3.qkv_bias  # Qwen3's default head_dim
    qwen2 = parse_config({**base, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 32})
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.layer_windows == (None,)  # window unused
    mistral = parse_config({**base, "architectures": ["MistralForCausalLM"], "sliding_window": 32})
    assert mistral.layer_windows == (32,) and mistral.num_kv_heads == 4 and mistral.head_dim == 16
    assert mistral.max_model_len == 2048  # the window is exact: it caps nothing
    llama = parse_config(
        {**base, "architectures": ["LlamaForCausalLM"], "attention_bias": True, "eos_token_id": 9}
    )
    assert llama.qkv_bias and llama.o_bias and llama.eos_token_ids == (9,)


def test_rope_config_reads_both_spellings():
    old = RopeConfig.from_hf({"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}})
    new = RopeConfig.from_hf({"rope_parameters": {"rope_type": "linear", "rope_theta": 5e5, "factor": 2.0}})
    assert old == new == RopeConfig("linear", 5e5, {"factor": 2.0})
    assert RopeConfig.from_hf({}) == RopeConfig("default", 10000.0, {})
    with pytest.raises(ValueError, match="longrope"):
        RopeConfig.from_hf({"rope_scaling": {"rope_type": "longrope"}})
