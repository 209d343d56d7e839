"""The mixture-of-experts models served quantized from a GGUF the test writes (tests/harness/gguf_models.py,
llama.cpp's layout: each projection of a layer's experts one 3-D tensor), against the
dequantize-then-float32 reference of the same folder, under test_quantized_model.py's allowance: the
first token of every prompt equal, and at least 11 of 12 prompts equal token for token."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from harness.gguf_models import quantize_checkpoint
from harness.greedy_reference import random_prompts

from pagedserve import LLM, SamplingParams
from pagedserve.kernels.torch_backend import TorchAttentionBackend
from pagedserve.services.worker.layers.moe import QuantExpertLinear, Router, SparseMoeBlock
from pagedserve.services.worker.layers.quant_linear import QuantLinear
from pagedserve.services.worker.weights.loader import load_model

CASES = [
    ("qwen2_moe", "Q8_0", {}),  # shared expert quantized beside the routed ones; its gate stays float32
    ("qwen3_moe", "Q4_1", {}),  # a dense layer (mlp_only_layers) between sparse ones
    ("mixtral", "Q4_0", {}),  # the "llama" arch: q/k rows reordered in the file
    ("olmoe", "Q8_0", {}),
    # Q4_K's blocks are 256 wide: every linear's input is a multiple of 256
    (
        "qwen3_moe",
        "Q4_K",
        {
            "hidden_size": 256,
            "num_attention_heads": 2,
            "head_dim": 128,
            "intermediate_size": 256,
            "moe_intermediate_size": 256,
        },
    ),
]


def _quantized_copy(tiny_model, tmp_path: Path, arch: str, type_name: str, overrides: dict) -> Path:
    folder = tmp_path / arch
    shutil.copytree(tiny_model(arch, **overrides), folder)
    quantize_checkpoint(folder, type_name)
    return folder


def _greedy(folder: Path, quantization: str, prompts: list[list[int]]) -> tuple[list[list[int]], dict]:
    llm = LLM(str(folder), num_blocks=256, quantization=quantization)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)], llm.runner.runtime


@pytest.mark.parametrize(("arch", "type_name", "overrides"), CASES, ids=[f"{a}-{t}" for a, t, _ in CASES])
def test_greedy_outputs_match_the_dequantized_reference(tiny_model, tmp_path, arch, type_name, overrides):
    folder = _quantized_copy(tiny_model, tmp_path, arch, type_name, overrides)
    prompts = random_prompts(12, seed=3, max_len=40)
    quantized, runtime = _greedy(folder, "gguf", prompts)
    reference, dense_runtime = _greedy(folder, "none", prompts)
    assert runtime["weights"].startswith(f"gguf {type_name}x"), runtime
    assert dense_runtime["weights"] == "float32"
    assert [q[0] for q in quantized] == [r[0] for r in reference]
    same = sum(q == r for q, r in zip(quantized, reference, strict=True))
    assert same >= 11, f"{same}/12 prompts matched token for token"


def test_experts_stay_packed_and_compute_what_the_dequantized_experts_do(tiny_model, tmp_path):
    folder = _quantized_copy(tiny_model, tmp_path, "qwen2_moe", "Q4_1", {})
    quantized = load_model(folder, TorchAttentionBackend(), quantization="gguf").model
    dense = load_model(folder, TorchAttentionBackend(), quantization="none").model
    block_q, block_d = quantized.layers[1].mlp, dense.layers[1].mlp
    assert isinstance(block_q, SparseMoeBlock)
    experts = block_q.experts
    assert isinstance(experts.gate_up_proj, QuantExpertLinear)
    assert isinstance(experts.down_proj, QuantExpertLinear)
    assert experts.gate_up_proj.blocks.shape[0] == 5 * 2 * 32  # 5 experts x (gate 32 + up 32) rows
    assert isinstance(block_q.shared_expert.gate_up_proj, QuantLinear)
    assert isinstance(block_q.gate, Router) and block_q.gate.weight.dtype == torch.float32  # dense
    x = torch.randn(9, 96)
    with torch.inference_mode():
        for expert in range(5):
            for name in ("gate_up_proj", "down_proj"):
                q, d = experts.get_submodule(name), block_d.experts.get_submodule(name)
                rows = x[:, : d.in_features]
                torch.testing.assert_close(
                    q.forward(expert, rows), d.forward(expert, rows), rtol=1e-4, atol=1e-4
                )
        torch.testing.assert_close(block_q(x), block_d(x), rtol=1e-4, atol=1e-4)


def test_experts_of_a_type_the_kernel_lacks_stay_dense(tiny_model, tmp_path):
    """A GGUF whose experts are MXFP4 (no kernel runs it): under `auto` they load dense, the rest stays
    quantized (`gguf` refuses such a file, naming the tensors: test_gguf_types.py)."""
    folder = tmp_path / "m"
    shutil.copytree(tiny_model("mixtral"), folder)
    quantize_checkpoint(folder, "Q8_0", expert_type="MXFP4")
    model = load_model(folder, TorchAttentionBackend(), quantization="auto").model
    experts = model.layers[0].mlp.experts
    assert type(experts.gate_up_proj).__name__ == "ExpertLinear"
    assert isinstance(model.layers[0].self_attn.qkv_proj, QuantLinear)


@pytest.mark.parametrize(
    ("arch", "type_name", "overrides"), [CASES[2], CASES[4]], ids=["mixtral-Q4_0", "qwen3_moe-Q4_K"]
)
def test_int8_experts_take_the_interleaved_rows_where_the_kernel_runs_them(
    tiny_model, tmp_path, arch, type_name, overrides
):
    """With int8 activations, Q4_0/Q4_K experts whose rows per expert are whole chunks of 8 take the kernel's
    interleaved layout where its path runs it (avx2, avx512; quant_linear.kernel_layout), each expert still its
    own run of rows, and compute what the dequantized experts do within the int8 allowance
    (test_quantized_model.py's: 2% of the largest output)."""
    from pagedserve.services.worker.layers.quant_linear import quant_ops, weight_layout

    folder = _quantized_copy(tiny_model, tmp_path, arch, type_name, overrides)
    quantized = load_model(
        folder, TorchAttentionBackend(), quantization="gguf", quant_activations="int8"
    ).model
    dense = load_model(folder, TorchAttentionBackend(), quantization="none").model
    stored = {"Q4_0": 2, "Q4_K": 12}[type_name]
    layout = quant_ops().interleaved_type(stored) or stored  # 100 + stored on the avx2 and avx512 paths
    blocks = [(q.mlp, d.mlp) for q, d in zip(quantized.layers, dense.layers, strict=True)]
    block_q, block_d = next((q, d) for q, d in blocks if isinstance(q, SparseMoeBlock))
    assert isinstance(block_q, SparseMoeBlock) and isinstance(block_d, SparseMoeBlock)
    experts = block_q.experts
    gate_up, down = experts.gate_up_proj, experts.down_proj
    assert isinstance(gate_up, QuantExpertLinear) and isinstance(down, QuantExpertLinear)
    hidden = gate_up.in_features
    x = torch.randn(9, max(hidden, down.in_features))
    with torch.inference_mode():
        for q, d in ((gate_up, block_d.experts.gate_up_proj), (down, block_d.experts.down_proj)):
            assert q.type_id == layout and q.out_features % 8 == 0
            for expert in range(experts.num_experts):
                rows = x[:, : q.in_features]
                expected = d.forward(expert, rows)
                assert (q.forward(expert, rows) - expected).abs().max() <= 0.02 * expected.abs().max()
        expected = block_d(x[:, :hidden])
        assert (block_q(x[:, :hidden]) - expected).abs().max() <= 0.02 * expected.abs().max()
    summary = weight_layout(quantized)  # the start log's count, each expert set one matrix
    if layout == stored:
        assert summary == "stored"
    else:
        interleaved, total = map(int, summary.removeprefix("rows interleaved by 8: ").split()[::2])
        moe_layers = sum(isinstance(q, SparseMoeBlock) for q, _ in blocks)
        assert 2 * moe_layers <= interleaved <= total, summary
