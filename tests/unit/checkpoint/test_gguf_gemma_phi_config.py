"""The Gemma 2, Gemma 3 and Phi-3 GGUF metadata rules (services/gguf_gemma_phi.py) on metadata alone:
what llama.cpp assumes for an absent key, the layouts it can state, and a clear refusal (file and key
named) for what cannot be served right. Files converted by llama.cpp itself are served in
tests/unit/worker/test_gguf_gemma_phi.py (with the peer installed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pagedserve.services.gguf_config import hf_config
from pagedserve.services.gguf_file import GGUFError, GGUFModel, TensorInfo
from pagedserve.services.worker.layers.norm import RMSNorm
from pagedserve.services.worker.models.registry import parse_config
from pagedserve.services.worker.weights.gguf_weights import hf_name

FILE = Path("/models/m.gguf")


def _model(arch: str, layers: int = 4, tensors: dict[str, TensorInfo] | None = None, **keys) -> GGUFModel:
    metadata = {
        "general.architecture": arch,
        f"{arch}.context_length": 4096,
        f"{arch}.embedding_length": 64,
        f"{arch}.block_count": layers,
        f"{arch}.feed_forward_length": 128,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        **{f"{arch}.{k}": v for k, v in keys.items() if v is not None},
    }
    embedding = TensorInfo("token_embd.weight", (64, 100), 0, FILE, 0, 64 * 100 * 4)
    return GGUFModel((FILE,), metadata, {"token_embd.weight": embedding, **(tensors or {})})


def _keys(**keys):
    return {k.replace("__", "."): v for k, v in keys.items()}


def test_gemma2_takes_llamacpps_defaults():
    config = hf_config(_model("gemma2", layers=5, **_keys(attention__key_length=32)))
    parsed = parse_config(config)
    assert parsed.layer_windows == (4096, None, 4096, None, 4096)  # pattern 2: even layers slide
    assert parsed.scale == 32**-0.5  # query_pre_attn_scalar = head_dim
    assert (parsed.attn_logit_softcap, parsed.final_logit_softcap) == (50.0, 30.0)
    assert parsed.rope.theta == 10_000.0 and parsed.hidden_act == "gelu_pytorch_tanh"
    assert parsed.tie_word_embeddings and parsed.norm_unit_offset and parsed.embed_scale == 8.0


@pytest.mark.parametrize(("arch", "layers"), [("gemma2", 46), ("gemma3", 62)])
def test_the_27b_models_scale_attention_by_hidden_over_heads(arch, layers):
    config = hf_config(
        _model(arch, layers=layers, **_keys(attention__key_length=32, attention__sliding_window=8))
    )
    assert config["query_pre_attn_scalar"] == 16  # 64 / 4, not the head size 32, as llama.cpp does


def test_gemma3_windows_pattern_and_local_rotary():
    model = _model(
        "gemma3",
        layers=7,
        **_keys(
            attention__sliding_window=11,
            rope__freq_base=1e6,
            rope__scaling__type="linear",
            rope__scaling__factor=8.0,
        ),
    )
    parsed = parse_config(hf_config(model))
    assert parsed.layer_windows == (11, 11, 11, 11, 11, None, 11)  # llama.cpp's default pattern of 6
    assert parsed.sliding_rope is not None and parsed.sliding_rope.theta == 10_000.0
    assert parsed.sliding_rope.rope_type == "default"
    assert (parsed.rope.theta, parsed.rope.rope_type, parsed.rope.params["factor"]) == (1e6, "linear", 8.0)
    assert parsed.attn_logit_softcap is None and parsed.final_logit_softcap is None
    local = _model("gemma3", **_keys(attention__sliding_window=11, rope__freq_base_swa=100.0))
    assert parse_config(hf_config(local)).sliding_rope.theta == 100.0
    no_window = parse_config(hf_config(_model("gemma3")))
    assert no_window.layer_windows == (None,) * 4  # without the key llama.cpp slides nowhere


def test_a_per_layer_pattern_array_and_a_pattern_count():
    model = _model(
        "gemma3",
        **_keys(attention__sliding_window=5, attention__sliding_window_pattern=[True, False, False, True]),
    )
    assert parse_config(hf_config(model)).layer_windows == (5, None, None, 5)
    counted = _model("gemma2", **_keys(attention__sliding_window=5, attention__sliding_window_pattern=3))
    assert parse_config(hf_config(counted)).layer_windows == (5, 5, None, 5)
    wrong = _model(
        "gemma3", **_keys(attention__sliding_window=5, attention__sliding_window_pattern=[True, False])
    )
    with pytest.raises(
        GGUFError, match=r"m\.gguf: gemma3\.attention\.sliding_window_pattern has 2 entries; the model has 4"
    ):
        hf_config(wrong)


def test_gemma2_with_a_local_rotary_base_of_its_own_is_refused():
    model = _model("gemma2", **_keys(rope__freq_base=10_000.0, rope__freq_base_swa=100.0))
    with pytest.raises(GGUFError, match=r"m\.gguf: gemma2\.rope\.freq_base_swa \(100\.0\) differs"):
        hf_config(model)


def test_a_missing_required_key_is_named():
    model = _model("gemma3")
    del model.metadata["gemma3.attention.layer_norm_rms_epsilon"]
    with pytest.raises(
        GGUFError, match=r"m\.gguf lacks metadata the model needs: gemma3\.attention\.layer_norm_rms_epsilon"
    ):
        hf_config(model)


def _factors(tmp_path: Path, short: list[float], long: list[float]) -> dict[str, TensorInfo]:
    path = tmp_path / "f.gguf"
    data = np.array([*short, *long], dtype="<f4")
    path.write_bytes(data.tobytes())
    n = 4 * len(short)
    return {
        "rope_factors_short.weight": TensorInfo("rope_factors_short.weight", (len(short),), 0, path, 0, n),
        "rope_factors_long.weight": TensorInfo(
            "rope_factors_long.weight", (len(long),), 0, path, n, 4 * len(long)
        ),
    }


def test_phi3_longrope_from_the_factor_tensors(tmp_path):
    factors = _factors(tmp_path, [1.0, 1.5, 2.0, 2.5], [1.0, 3.0, 5.0, 9.0])
    keys = _keys(
        rope__dimension_count=8, rope__scaling__original_context_length=1024, attention__sliding_window=0
    )
    parsed = parse_config(hf_config(_model("phi3", tensors=factors, **keys)))
    assert parsed.layer_windows == (None,) * 4  # 0: no window (Phi-4)
    assert parsed.rope.rope_type == "longrope" and parsed.rope.partial == 0.5
    assert parsed.rope.params["long_factor"] == [1.0, 3.0, 5.0, 9.0]
    assert parsed.rope.long_from == 1024
    assert "attention_factor" not in parsed.rope.params  # transformers' default, recomputed exactly
    odd = _model("phi3", tensors=factors, **{**keys, "rope.scaling.attn_factor": 1.5})
    assert parse_config(hf_config(odd)).rope.params["attention_factor"] == 1.5


def test_phi3_longrope_refusals(tmp_path):
    factors = _factors(tmp_path, [1.0, 1.5, 2.0, 2.5], [1.0, 3.0, 5.0, 9.0])
    keys = _keys(rope__dimension_count=8, rope__scaling__original_context_length=1024)
    with pytest.raises(GGUFError, match="holds rope_factors_long.weight without its pair"):
        hf_config(
            _model("phi3", tensors={"rope_factors_long.weight": factors["rope_factors_long.weight"]}, **keys)
        )
    no_original = {**keys, "rope.scaling.original_context_length": None}
    with pytest.raises(
        GGUFError, match=r"lacks metadata the model needs: phi3\.rope\.scaling\.original_context_length"
    ):
        hf_config(_model("phi3", tensors=factors, **no_original))
    with pytest.raises(GGUFError, match="LongRoPE factors have 4 / 4 values; 16 rotary dimensions need 8"):
        hf_config(_model("phi3", tensors=factors, **{**keys, "rope.dimension_count": 16}))


def test_tensor_names_per_architecture():
    assert hf_name("blk.2.ffn_norm.weight") == "model.layers.2.post_attention_layernorm.weight"
    assert hf_name("blk.2.ffn_norm.weight", "gemma2") == "model.layers.2.pre_feedforward_layernorm.weight"
    assert (
        hf_name("blk.2.post_ffw_norm.weight", "gemma3") == "model.layers.2.post_feedforward_layernorm.weight"
    )
    assert (
        hf_name("blk.2.post_attention_norm.weight", "gemma3")
        == "model.layers.2.post_attention_layernorm.weight"
    )
    assert hf_name("blk.0.attn_qkv.weight", "phi3") == "model.layers.0.self_attn.qkv_proj.weight"
    assert hf_name("blk.0.ffn_up.weight", "phi3") == "model.layers.0.mlp.gate_up_proj.weight"
    assert hf_name("blk.0.ffn_up.weight", "gemma2") == "model.layers.0.mlp.up_proj.weight"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_norm_stored_as_one_plus_w_is_not_offset_again(dtype):
    stored = torch.tensor([1.25, 0.5, 2.0])
    norm = RMSNorm(3, 1e-6, unit_offset=True).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(stored)
    norm.fold_unit_offset(stored=True)
    assert torch.equal(norm.weight.float(), stored)
    if dtype != torch.float32:
        assert torch.equal(norm.scale_f32, stored)
    folded = RMSNorm(3, 1e-6, unit_offset=True)
    with torch.no_grad():
        folded.weight.copy_(stored - 1)
    folded.fold_unit_offset()
    assert torch.equal(folded.weight, stored)
