"""A GGUF matrix in a type the quantized kernel does not run: refused by name under --quantization gguf,
dequantized (and logged by name) under auto; a type nothing here reads is refused either way.

The files are written by hand (the gguf package's writer): only their headers and the types matter,
so the blocks are random bytes of each type's size.
"""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from pagedserve.services.worker.layers.quant_linear import KERNEL_TYPES
from pagedserve.services.worker.weights.gguf_types import unpacked_matrices
from pagedserve.services.worker.weights.gguf_weights import map_gguf, quantized_tensors


def _blocks(type_name: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return np.random.default_rng(seed).integers(0, 256, (rows, k // block * size), dtype=np.uint8)


def write_gguf(path: Path, tensors: dict[str, tuple[str, int, int]]) -> Path:
    """tensors: GGUF name -> (type, rows, row length); a 1-D F32 one where rows is 0."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.attention.head_count", 2)
    writer.add_uint32("llama.attention.head_count_kv", 2)
    for name, (type_name, rows, k) in tensors.items():
        if rows == 0:
            writer.add_tensor(name, np.ones(k, dtype=np.float32))
        else:
            kind = GGMLQuantizationType[type_name]
            writer.add_tensor(name, _blocks(type_name, rows, k), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def set_type_id(path: Path, tensor: str, type_id: int) -> None:
    """Rewrite one tensor's type id in the header (a type newer than the gguf package)."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)
    path.write_bytes(bytes(data))


MODEL = {
    "token_embd.weight": ("Q6_K", 64, 256),
    "blk.0.attn_norm.weight": ("F32", 0, 256),
    "blk.0.attn_q.weight": ("IQ2_XXS", 256, 256),  # the kernel lacks it, the gguf package reads it
    "blk.0.attn_k.weight": ("Q4_K", 256, 256),
    "blk.0.ffn_down.weight": ("F16", 256, 48),  # F16 rows not whole groups of 32
}


def test_strict_refuses_naming_each_tensor_and_its_type(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", MODEL)
    with pytest.raises(ValueError) as refused:
        quantized_tensors(map_gguf(path), strict=True)
    message = str(refused.value)
    assert message.startswith("--quantization gguf: m.gguf: ")
    assert "blk.0.attn_q.weight (IQ2_XXS)" in message and "blk.0.ffn_down.weight (F16)" in message
    assert "token_embd" not in message and "attn_k" not in message  # those stay packed
    assert ", ".join(KERNEL_TYPES) in message and "--quantization auto dequantizes" in message


def test_auto_keeps_what_it_can_and_leaves_the_rest_to_the_dense_load(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", MODEL)
    held = quantized_tensors(map_gguf(path))
    assert {name: t.type_name for name, t in held.items()} == {
        "model.embed_tokens.weight": "Q6_K",
        "model.layers.0.self_attn.k_proj.weight": "Q4_K",
    }


def test_a_type_nothing_reads_is_refused_even_under_auto(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", MODEL)
    set_type_id(path, "blk.0.attn_k.weight", 99)
    # The header reader refuses it before any setting applies, naming the file, tensor and type id.
    with pytest.raises(
        ValueError, match=r"m.gguf: tensor 'blk.0.attn_k.weight' has ggml type 99, which is unknown"
    ):
        map_gguf(path)
    # Q8_1 is a type the gguf package names but has no dequantizer for
    found = unpacked_matrices([("blk.1.ffn_up.weight", int(GGMLQuantizationType.Q8_1), (256, 8))])
    assert [(u.tensor, u.type_name, u.dequantizable) for u in found] == [
        ("blk.1.ffn_up.weight", "Q8_1", False)
    ]


def test_vectors_and_f32_matrices_are_never_listed() -> None:
    f32, q8 = int(GGMLQuantizationType.F32), int(GGMLQuantizationType.IQ2_XXS)
    assert unpacked_matrices([("output.weight", f32, (256, 64)), ("blk.0.ffn_norm.weight", q8, (256,))]) == []


def test_a_model_load_names_them_and_auto_loads_the_rest_dense(tmp_path: Path) -> None:
    """F16 weights of a model 48 wide: rows of 48 are not whole groups of 32, so every matrix reading
    the hidden state is dequantized (auto) or refused (gguf); ffn_down (rows of 128) stays packed."""
    from harness.gguf_models import quantize_checkpoint
    from harness.tiny_models import make_tiny_model

    from pagedserve.kernels.torch_backend import TorchAttentionBackend
    from pagedserve.services.worker.layers.quant_linear import QuantLinear
    from pagedserve.services.worker.weights.loader import load_model

    folder = make_tiny_model("llama", tmp_path / "m", hidden_size=48, num_attention_heads=4)
    quantize_checkpoint(folder, "F16")
    with pytest.raises(ValueError, match=r"--quantization gguf: model.gguf: token_embd.weight \(F16\), "):
        load_model(folder, TorchAttentionBackend(), quantization="gguf")
    model = load_model(folder, TorchAttentionBackend(), quantization="auto").model
    assert isinstance(model.layers[0].mlp.down_proj, QuantLinear)
    assert not isinstance(model.layers[0].self_attn.qkv_proj, QuantLinear)
