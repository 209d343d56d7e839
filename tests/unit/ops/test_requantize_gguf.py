"""The requantizer behind `python -m pagedserve.ops.models.requantize_gguf`, on a tiny Q4_1 GGUF made in
the test: every quantized tensor comes out in the new type holding the same weights to within its
rounding, metadata and norms copied, and its dequantized checkpoint in Hugging Face's names and row order."""

from __future__ import annotations

from pathlib import Path

import gguf
from harness.gguf_models import quantize_checkpoint
from harness.tiny_models import make_tiny_model
from safetensors.torch import load_file

from pagedserve.ops.models.requantize_gguf import dequantized_checkpoint, requantize


def test_requantized_gguf_holds_the_same_weights_in_the_new_type(tmp_path: Path) -> None:
    folder = make_tiny_model("llama", tmp_path / "m")
    source = quantize_checkpoint(folder, "Q4_1")  # folder's safetensors: the Q4_1 values, HF order
    out = tmp_path / "q8.gguf"
    requantize(source, out, "Q8_0")
    old, new = gguf.GGUFReader(source), gguf.GGUFReader(out)
    assert new.fields["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_Q8_0)
    assert (
        new.fields["llama.attention.head_count"].contents()
        == old.fields["llama.attention.head_count"].contents()
    )
    types = {t.name: t.tensor_type.name for t in new.tensors}
    assert {types[t.name] for t in old.tensors if t.tensor_type.name == "Q4_1"} == {"Q8_0"}
    assert all(types[t.name] == "F32" for t in old.tensors if t.tensor_type.name == "F32")

    reference = load_file(folder / "model.safetensors")
    requantized = dequantized_checkpoint(out)
    assert set(requantized) == set(reference)
    for name, values in reference.items():
        # Q8_0 rounds each weight to within half its 32-group's step (the largest magnitude / 127), and
        # the step itself is stored in fp16 (off by up to 2^-11 of itself, times up to 127 codes).
        groups = values.reshape(-1, 32) if values.dim() == 2 else values.reshape(1, -1)
        bound = groups.abs().amax(1, keepdim=True) / 127 * (0.5 + 127 / 2**11) + 1e-7
        diff = (requantized[name].reshape(groups.shape) - groups).abs()
        assert bool((diff <= bound).all()), name
