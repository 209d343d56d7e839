"""What a quantized load keeps resident: each GGUF weight once, in its blocks, and nothing dense for it.

The bundled model's numbers are measured by `python -m pagedserve.ops.microbench.weights_rss`; these
tests pin the properties those numbers rest on, on a tiny model quantized in the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import torch
from harness.gguf_models import quantize_checkpoint
from harness.tiny_models import make_tiny_model

from pagedserve.kernels.torch_backend import TorchAttentionBackend
from pagedserve.ops.microbench.weights_rss import (
    gguf_step_read_bytes,
    held_tensors,
    model_bytes,
    step_read_bytes,
)
from pagedserve.services.worker.layers.quant_linear import QuantEmbedding, QuantLinear, weight_types
from pagedserve.services.worker.weights.loader import load_model


def test_a_gguf_load_holds_its_blocks_once_and_unmaps_the_file(tmp_path: Path) -> None:
    folder = make_tiny_model("llama", tmp_path / "m")
    gguf_file = quantize_checkpoint(folder, "Q4_1")
    model = load_model(folder, TorchAttentionBackend(), quantization="gguf").model
    quantized = [m for m in model.modules() if isinstance(m, (QuantLinear, QuantEmbedding))]
    held = [t for m in quantized for t in held_tensors(m)]
    blocks = {t.untyped_storage().data_ptr(): t.nbytes for t in held if t.dtype == torch.uint8}
    dense = sum(p.nbytes for p in model.parameters())  # the norms: every linear is quantized
    cfg = model.config
    assert dense == (2 * cfg.num_layers + 1) * cfg.hidden_size * 4
    # The tied head shares the embedding's blocks; nothing else holds weight bytes.
    assert model.tied_head.runs[0][1].data_ptr() == model.embed_tokens.blocks.data_ptr()
    assert model_bytes(model) == sum(blocks.values()) + dense + model.rotary.inv_freq.nbytes
    # Copied out of the file, which is then unmapped: not resident twice (file pages and a copy).
    assert str(gguf_file) not in Path("/proc/self/maps").read_text()


def test_a_q4_k_m_load_holds_the_files_bytes_and_no_float_matrix(tmp_path: Path) -> None:
    """llama.cpp's Q4_K_M mix (Q4_K, with the embedding, tied head, half the attn_v and ffn_down in
    Q6_K): every matrix stays in its stored blocks, so the model holds exactly the file's tensor bytes
    (the norms F32 as stored), and a decode step reads what llama.cpp reads of the same file."""
    folder = make_tiny_model("llama", tmp_path / "m", hidden_size=256, intermediate_size=512)
    gguf_file = quantize_checkpoint(folder, "Q4_K_M")
    model = load_model(folder, TorchAttentionBackend(), quantization="gguf").model
    held = [t for m in model.modules() for t in held_tensors(m)]
    assert [tuple(t.shape) for t in held if t.is_floating_point() and t.dim() >= 2] == []
    # 3 layers of 7 matrices; Q6_K: attn_v and ffn_down of layers 0 and 2, and the embedding
    assert weight_types(model) == {("gguf", "Q4_K"): 17, ("gguf", "Q6_K"): 5}
    stored = gguf.GGUFReader(gguf_file).tensors
    assert model_bytes(model) == sum(int(t.n_bytes) for t in stored) + model.rotary.inv_freq.nbytes
    assert step_read_bytes(model) == gguf_step_read_bytes(gguf_file)


LOAD_AND_LIST = """
import json, sys
from pagedserve.kernels.torch_backend import TorchAttentionBackend
from pagedserve.services.worker.weights.loader import load_model
load_model(sys.argv[1], TorchAttentionBackend(), quantization=sys.argv[2])
print(json.dumps(sorted(m for m in ("sympy", "torch._dynamo", "triton") if m in sys.modules)))
"""


def test_loading_imports_neither_dynamo_nor_sympy(tmp_path: Path) -> None:
    """Building on the meta device and moving to the CPU can run torch's Python references, which
    import torch._dynamo, triton and sympy: ~200 MiB of RSS a worker never uses."""
    folder = make_tiny_model("llama", tmp_path / "m")
    quantize_checkpoint(folder, "Q8_0")
    for quantization in ("none", "gguf"):
        done = subprocess.run(
            [sys.executable, "-c", LOAD_AND_LIST, str(folder), quantization],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert json.loads(done.stdout.strip().splitlines()[-1]) == [], quantization


def test_the_weights_rss_tool_runs_end_to_end_on_a_gguf_folder(tmp_path: Path) -> None:
    """The tool the docs' memory tables come from: one child process per form, then the parent's own
    summary (it once imported `resolve_model` from a module that no longer had it, after the rows)."""
    folder = make_tiny_model("llama", tmp_path / "m")
    quantize_checkpoint(folder, "Q4_1")
    done = subprocess.run(
        [sys.executable, "-m", "pagedserve.ops.microbench.weights_rss", "--models", str(folder), "--kv-mib", "4"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    assert [row["quantization"] for row in rows] == ["none", "gguf"]
    assert all(row["weights_mib"] > 0 and row["kv_pool_mib"] == 4 for row in rows)
    assert any("llama.cpp reads" in line for line in lines)
    assert any("gguf / none: RSS" in line for line in lines)
