"""The weight bytes a decode step reads (ops/microbench/decode_bandwidth.py), on tiny GGUF models the test
writes: a tied head reads the embedding's blocks once, an untied one leaves the table to its rows, and a
MoE layer's experts count by the share one token routes to."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.gguf_models import quantize_checkpoint

from pagedserve.kernels.torch_backend import TorchAttentionBackend
from pagedserve.ops.microbench.decode_bandwidth import read_bandwidth, weight_bytes_per_token
from pagedserve.services.worker.layers.moe import SparseMoeBlock
from pagedserve.services.worker.weights.loader import load_model


def _model(tiny_model, tmp_path: Path, arch: str, type_name: str):
    folder = tmp_path / arch
    shutil.copytree(tiny_model(arch), folder)
    quantize_checkpoint(folder, type_name)
    return load_model(folder, TorchAttentionBackend(), quantization="gguf").model


def _all_bytes(model) -> int:
    """Every weight tensor's bytes once (parameters and GGML blocks, the tied head's shared ones once)."""
    seen: dict[int, int] = {}
    for module in model.modules():
        tensors = list(module.parameters(recurse=False))
        tensors += [blocks for _, blocks, _ in getattr(module, "runs", [])]
        if hasattr(module, "blocks"):
            tensors.append(module.blocks)
        seen.update({t.data_ptr(): t.numel() * t.element_size() for t in tensors})
    return sum(seen.values())


def test_a_tied_head_reads_the_table_once(tiny_model, tmp_path: Path) -> None:
    model = _model(tiny_model, tmp_path, "llama", "Q4_1")  # tied: the head is a linear over the table
    assert model.tied_head is not None
    assert weight_bytes_per_token(model) == _all_bytes(model)


def test_an_untied_head_leaves_the_table_to_its_rows(tiny_model, tmp_path: Path) -> None:
    model = _model(tiny_model, tmp_path, "mistral", "Q8_0")
    table = model.embed_tokens.blocks
    assert model.lm_head is not None
    assert weight_bytes_per_token(model) == _all_bytes(model) - table.numel()


def test_experts_count_by_the_share_one_token_reads(tiny_model, tmp_path: Path) -> None:
    model = _model(tiny_model, tmp_path, "mixtral", "Q4_0")
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    experts = sum(b.experts.gate_up_proj.blocks.numel() + b.experts.down_proj.blocks.numel() for b in blocks)
    routed = weight_bytes_per_token(model)
    for block in blocks:
        top_k, block.top_k = block.top_k, block.experts.num_experts  # every expert: all their bytes
    everything = weight_bytes_per_token(model)
    assert everything == _all_bytes(model) - model.embed_tokens.blocks.numel()
    assert abs(everything - routed - experts * (1 - top_k / blocks[0].experts.num_experts)) <= 1  # int()


def test_the_machine_reads_at_some_positive_rate() -> None:
    assert read_bandwidth(1) > 1e8  # 100 MB/s: any machine that runs the tests reads faster


def test_packed_weights_count_as_the_dense_ones(tiny_model) -> None:
    """oneDNN's packed weights are opaque tensors (no data pointer); a dense model reads as many bytes
    packed (its tied head a packed copy of the table) as unpacked."""
    model = load_model(tiny_model("llama"), TorchAttentionBackend(), quantization="none").model
    dense = weight_bytes_per_token(model)
    assert dense == _all_bytes(model)
    assert model.prepack_weights() > 0
    assert weight_bytes_per_token(model) == dense
