"""Tiny models quantized in the test itself (tests/harness/gguf_models.py writes the GGUF), served quantized,
against the dequantize-then-float32 reference: the same folder loaded with --quantization none, whose
safetensors hold the GGUF's dequantized values.

Allowance for greedy equality: the two differ only in the order of each dot product's float32 sum
(~1e-6 relative), so a greedy token may flip only where the top two logits are that close; over 12
prompts of 12 tokens at least 11 must match token for token (in practice all do), and the first
token of every prompt must match.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from harness.gguf_models import quantize_checkpoint
from harness.greedy_reference import random_prompts
from harness.tiny_models import make_tiny_model
from pydantic import ValidationError

from pagedserve import LLM, SamplingParams
from pagedserve.kernels.torch_backend import TorchAttentionBackend
from pagedserve.services.worker.layers.quant_linear import (
    QuantEmbedding,
    QuantLinear,
    quant_ops,
    weight_layout,
)
from pagedserve.services.worker.weights.loader import load_model
from pagedserve.shared.config import config_of

WIDE = {"hidden_size": 256, "intermediate_size": 512}  # the K-quants' super-blocks are 256 weights
CASES = [
    ("llama", "Q4_1", {}),  # tied head on the quantized embedding; q/k rows reordered as llama.cpp does
    ("llama", "Q8_0", {}),
    ("llama", "Q4_K", WIDE),
    ("qwen2", "Q4_0", {}),  # qkv bias: that projection stays dense; an untied quantized head
    ("qwen3", "Q4_1", {}),  # q/k norms, head_dim != hidden / heads
    ("llama", "F16", {}),  # F16 kept as stored: no float32 copy
    # llama.cpp's most used presets: Q6_K embedding (the tied head) and attn_v / ffn_down in half the
    # layers, so a fused q/k/v holds Q4_K q and k beside a Q6_K v
    ("llama", "Q4_K_M", WIDE),
    ("mistral", "Q5_K_M", WIDE),  # an untied Q6_K head
    (
        "mistral",
        "every-type",
        WIDE,
    ),  # each tensor kind another type (harness MIXES): all 14 but Q4_0/1, Q8_0, Q4_K
]
# The types each case's `weights` must name (a mix's types; a plain case's one).
TYPES_OF = {
    "Q4_K_M": ("Q4_K", "Q6_K"),
    "Q5_K_M": ("Q5_K", "Q6_K"),
    "every-type": ("BF16", "F16", "Q2_K", "Q3_K", "IQ4_XS", "Q5_K", "Q6_K", "IQ4_NL", "Q5_0", "Q5_1"),
}


def _greedy(
    folder: Path, quantization: str, prompts: list[list[int]]
) -> tuple[list[list[int]], dict[str, str]]:
    llm = LLM(str(folder), num_blocks=256, quantization=quantization)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)], llm.runner.runtime


@pytest.mark.parametrize(("arch", "type_name", "overrides"), CASES, ids=[f"{a}-{t}" for a, t, _ in CASES])
def test_greedy_outputs_match_the_dequantized_reference(tmp_path: Path, arch, type_name, overrides) -> None:
    folder = make_tiny_model(arch, tmp_path / arch, **overrides)
    quantize_checkpoint(folder, type_name)
    prompts = random_prompts(12, seed=3, max_len=40)
    quantized, runtime = _greedy(folder, "gguf", prompts)
    reference, dense_runtime = _greedy(folder, "none", prompts)
    assert runtime["weights"].startswith("gguf ") and runtime["weights"].endswith(" + float32"), runtime
    held = dict(part.split("x") for part in runtime["weights"].split()[1:-2])
    assert set(held) == set(TYPES_OF.get(type_name, (type_name,))), runtime
    # every matrix stays quantized but a projection with a bias (qwen2's q/k/v)
    assert runtime["dense_weights"] == ("2 matrices and norms" if arch == "qwen2" else "norms"), runtime
    assert dense_runtime["weights"] == "float32"
    assert (runtime["quant_activations"], dense_runtime["quant_activations"]) == ("float32", "none")
    assert [q[0] for q in quantized] == [r[0] for r in reference]
    same = sum(q == r for q, r in zip(quantized, reference, strict=True))
    assert same >= 11, f"{same}/12 prompts matched token for token"


def test_logits_match_the_reference_closely(tmp_path: Path) -> None:
    folder = make_tiny_model("llama", tmp_path / "m")
    quantize_checkpoint(folder, "Q4_1")
    quantized = load_model(folder, TorchAttentionBackend(), quantization="gguf").model
    dense = load_model(folder, TorchAttentionBackend(), quantization="none").model
    assert isinstance(quantized.embed_tokens, QuantEmbedding)
    assert isinstance(quantized.layers[0].self_attn.qkv_proj, QuantLinear)
    assert isinstance(quantized.tied_head, QuantLinear)
    hidden = torch.randn(5, dense.config.hidden_size)
    ids = torch.tensor([3, 40, 300])
    with torch.inference_mode():
        assert torch.equal(quantized.embed_tokens(ids), dense.embed_tokens(ids))
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj"):
            layer_q, layer_d = quantized.layers[1].get_submodule(name), dense.layers[1].get_submodule(name)
            x = hidden[:, : layer_d.in_features]
            torch.testing.assert_close(layer_q(x), layer_d(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(
            quantized.compute_logits(hidden), dense.compute_logits(hidden), rtol=1e-4, atol=1e-4
        )


def test_gguf_without_a_gguf_is_refused_and_auto_loads_dense(tmp_path: Path) -> None:
    folder = make_tiny_model("llama", tmp_path / "m")
    with pytest.raises(ValueError, match="--quantization gguf: .* has no GGUF weights"):
        load_model(folder, TorchAttentionBackend(), quantization="gguf")
    model = load_model(folder, TorchAttentionBackend(), quantization="auto").model
    assert not any(isinstance(m, (QuantLinear, QuantEmbedding)) for m in model.modules())
    with pytest.raises(
        ValueError,
        match="quantization must be one of auto, none, gguf, gptq, awq, compressed-tensors; got 'int3'",
    ):
        load_model(folder, TorchAttentionBackend(), quantization="int3")


def test_auto_keeps_a_gguf_quantized_except_where_the_worker_cannot(tmp_path: Path) -> None:
    folder = make_tiny_model("llama", tmp_path / "m")
    quantize_checkpoint(folder, "Q8_0")
    model = load_model(folder, TorchAttentionBackend(), quantization="auto").model
    assert isinstance(model.layers[0].mlp.down_proj, QuantLinear)
    assert weight_layout(model) == "stored"  # float32 activations keep the file's row order
    dense = load_model(folder, TorchAttentionBackend(), quantization="auto", dtype="bfloat16").model
    assert not any(isinstance(m, QuantLinear) for m in dense.modules())
    with pytest.raises(ValueError, match="float32 activations"):
        load_model(folder, TorchAttentionBackend(), quantization="gguf", dtype="bfloat16")


def _int8_and_dense(tmp_path: Path):
    """A tiny Llama as Q4_1, loaded with int8 activations, and its dequantized reference."""
    folder = make_tiny_model("llama", tmp_path / "m")
    quantize_checkpoint(folder, "Q4_1")
    quantized = load_model(
        folder, TorchAttentionBackend(), quantization="gguf", quant_activations="int8"
    ).model
    return quantized, load_model(folder, TorchAttentionBackend(), quantization="none").model


def test_int8_activations_keep_the_linears_and_logits_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PAGEDSERVE_QUANT_ACTIVATIONS=int8 (opt-in): below the kernel's 24-row panels (a float32 GEMM from
    there), each linear quantizes its input rows to int8 per 32-block, as llama.cpp does. Each output
    then moves by up to 1/254 of its blocks' max |x| times the block's sum |w| (the kernel tests hold
    every path to that); here, at the model's scale, 16 rows: each linear within 2% of its largest
    reference output (~0.6% measured), logits within 5% of their spread, and the same top-1 token for at
    least 90% of rows. Greedy decoding is not held token for token: near-ties flip and the sequences
    part (docs/cpu-performance.md)."""
    quantized, dense = _int8_and_dense(tmp_path)
    assert quantized.layers[0].mlp.down_proj.mode == 1
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(16, dense.config.hidden_size, generator=generator)
    with torch.inference_mode():
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            layer_q, layer_d = quantized.layers[1].get_submodule(name), dense.layers[1].get_submodule(name)
            x = torch.randn(16, layer_d.in_features, generator=generator)
            expected = layer_d(x)
            assert (layer_q(x) - expected).abs().max() <= 0.02 * expected.abs().max(), name
        logits, expected = quantized.compute_logits(hidden), dense.compute_logits(hidden)
        assert (logits - expected).abs().max() <= 0.05 * expected.std()
        assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


def test_int8_activations_take_the_interleaved_rows_where_the_kernel_runs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With int8 activations, a Q4_1 linear whose rows are whole chunks of 8 takes the kernel's
    interleaved layout where its path has int8 tiles over it (avx2, avx512), and stays stored elsewhere; the tied
    head and the embedding still share one copy, and the embedding's rows decode exactly either way."""
    model, dense = _int8_and_dense(tmp_path)
    layout = quant_ops().interleaved_type(3) or 3  # 103 on the avx2 and avx512 paths
    linears = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert linears and all(type_id == layout for m in linears for type_id, _, _ in m.runs)
    head, embedding = model.tied_head, model.embed_tokens
    assert isinstance(head, QuantLinear) and isinstance(embedding, QuantEmbedding)
    head_type, head_blocks, _ = head.runs[0]
    assert embedding.type_id == head_type and embedding.blocks is head_blocks
    ids = torch.arange(embedding.num_embeddings)
    with torch.inference_mode():
        assert torch.equal(embedding(ids), dense.embed_tokens(ids))
    matrices = sum(len(m.runs) for m in linears)  # the tied embedding is the head's copy, not counted again
    expected = f"rows interleaved by 8: {matrices} of {matrices} matrices" if layout != 3 else "stored"
    assert weight_layout(model) == expected


def test_an_unknown_activation_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedserve.services.worker.layers.quant_linear import activation_mode

    assert activation_mode() == 0
    monkeypatch.setenv("PAGEDSERVE_QUANT_ACTIVATIONS", "int4")
    with pytest.raises(
        ValueError, match="PAGEDSERVE_QUANT_ACTIVATIONS must be one of float32, int8; got 'int4'"
    ):
        activation_mode()
    assert activation_mode("int8") == 1  # a worker's configured value, whatever the variable says
    with pytest.raises(ValueError, match="quant_activations must be one of float32, int8; got 'int4'"):
        activation_mode("int4")
    with pytest.raises(ValidationError, match="quant_activations"):  # the config names the field too
        config_of(quant_activations="int4")


def test_the_configured_activations_reach_every_quantized_linear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--quant-activations (ServeConfig.quant_activations) is how a deployment picks int8 activations:
    LLM and a worker hand it to the loader, every QuantLinear (the tied head too) takes it, and the
    runtime facts (start log, /process) say so. Configured, it wins over the variable; not configured,
    LLM's loader still reads the variable (the in-process tools are run with it)."""
    folder = make_tiny_model("llama", tmp_path / "m")
    quantize_checkpoint(folder, "Q4_1")
    llm = LLM(str(folder), num_blocks=64, quantization="gguf", quant_activations="int8")
    model = llm.runner.model
    linears = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert linears and {m.mode for m in linears} == {1} and model.tied_head in linears
    runtime = llm.runner.runtime
    assert runtime["quant_activations"] == "int8", runtime
    interleaved = quant_ops().interleaved_type(3) != 0  # the avx2 and avx512 paths
    assert runtime["weight_layout"].startswith("rows interleaved by 8") == interleaved, runtime
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    assert len(llm.generate([[1, 2, 3]], params)[0].token_ids) == 4
    monkeypatch.setenv("PAGEDSERVE_QUANT_ACTIVATIONS", "int8")
    configured = LLM(str(folder), num_blocks=64, quantization="gguf", quant_activations="float32")
    assert configured.runner.runtime["quant_activations"] == "float32"
    assert LLM(str(folder), num_blocks=64, quantization="gguf").runner.runtime["quant_activations"] == "int8"
