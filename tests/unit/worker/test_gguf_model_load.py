"""A .gguf file served by itself: the worker maps its tensors, keeps the kernel's types packed and
dequantizes the rest in memory, and greedy output equals the same model's checkpoint folder.

The folder (tests/harness/gguf_models.py) holds the GGUF's own dequantized values, so a dense load
of either is the same float32 model: equal token for token. Served quantized (Q8_0 kept), the file
differs from the folder only in the order of float32 sums: the allowance of test_quantized_model.py
(every first token equal, at least 11 of 12 prompts equal throughout).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from harness.gguf_models import rewrite_gguf, write_gguf
from harness.greedy_reference import random_prompts
from harness.tiny_models import make_tiny_model

from pagedserve import LLM, SamplingParams
from pagedserve.kernels.torch_backend import TorchAttentionBackend
from pagedserve.services.model_cache import cache_root
from pagedserve.services.worker.weights.loader import load_model

PROMPTS = random_prompts(12, seed=5, max_len=40)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("gguf-load")
    out = {}
    for arch, kind in (
        ("llama", "Q8_0"), ("qwen2", "F32"), ("qwen3", "F16"), ("mistral", "Q4_0"),
        ("qwen2_moe", "Q8_0"), ("qwen3_moe", "Q8_0"), ("mixtral", "Q8_0"), ("olmoe", "Q8_0"),
    ):  # fmt: skip
        folder = make_tiny_model(arch, root / arch)
        out[arch] = folder, write_gguf(folder, root / f"{arch}.gguf", kind)
    return out


def greedy(model: Path, quantization: str = "none", **kwargs) -> tuple[list[list[int]], str]:
    llm = LLM(str(model), num_blocks=128, quantization=quantization, **kwargs)
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)], llm.runner.runtime["weights"]


@pytest.mark.parametrize(
    "arch", ["llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "mixtral", "olmoe"]
)
def test_a_dense_load_of_the_file_is_the_folders_model(models, arch: str) -> None:
    folder, file = models[arch]
    from_file, weights = greedy(file)
    assert weights == "float32"
    assert from_file == greedy(folder)[0]


def test_the_file_served_quantized_keeps_its_types_and_matches_the_folder(models) -> None:
    folder, file = models["llama"]
    quantized, weights = greedy(file, "auto")
    reference, _ = greedy(folder)
    assert weights.startswith("gguf Q8_0x"), weights
    assert [q[0] for q in quantized] == [r[0] for r in reference]
    assert sum(q == r for q, r in zip(quantized, reference, strict=True)) >= 11


def test_a_split_set_serves_as_the_single_file(models, tmp_path: Path) -> None:
    folder, file = models["qwen3"]
    first = write_gguf(folder, tmp_path / "parts.gguf", "F16", split_max_tensors=7)
    assert len(list(tmp_path.glob("parts-*-of-*.gguf"))) > 2
    assert greedy(first)[0] == greedy(file)[0]


def test_loading_writes_no_weights_anywhere(models) -> None:
    _, file = models["llama"]
    places = (file.parent, cache_root())  # beside the file, and the cache (kernels, tokenizers)

    def files() -> set[Path]:
        return {p for place in places for p in place.rglob("*") if p.is_file()}

    before = files()
    for quantization in ("none", "auto"):
        load_model(file, TorchAttentionBackend(), quantization=quantization)
    new = files() - before
    assert not [p for p in new if p.suffix in (".safetensors", ".bin", ".gguf", ".pt", ".npy")], new


def test_a_tensor_the_loader_does_not_know_is_named(models, tmp_path: Path) -> None:
    _, file = models["qwen2"]
    # A tensor no Qwen2 model has, as a newer variant of the architecture would carry.
    extra = {"blk.0.attn_sinks.weight": np.zeros(4, np.float32)}
    path = rewrite_gguf(file, tmp_path / "with-extra.gguf", extra_tensors=extra)
    with pytest.raises(
        ValueError,
        match=r"with-extra.gguf \(qwen2\) holds tensors this loader does not know: blk.0.attn_sinks",
    ):
        load_model(path, TorchAttentionBackend())


@pytest.mark.parametrize("quantization", ["none", "auto"])
def test_a_shape_the_metadata_does_not_predict_names_the_file_and_tensor(
    models, tmp_path: Path, quantization: str
) -> None:
    _, file = models["llama"]  # 4 heads of 16: a feed-forward length of 96 instead of 128
    path = rewrite_gguf(file, tmp_path / "ffn.gguf", metadata={"llama.feed_forward_length": 96})
    with pytest.raises(ValueError, match=rf"{path}: .*mlp.(gate|up|down)_proj"):
        load_model(path, TorchAttentionBackend(), quantization=quantization)


def test_a_checkpoint_format_asked_of_a_gguf_is_refused_naming_why(models) -> None:
    _, file = models["llama"]
    with pytest.raises(ValueError, match="--quantization gptq: .* no quantization_config"):
        load_model(file, TorchAttentionBackend(), quantization="gptq")


def test_a_tokenizer_folder_replaces_the_files_own(models) -> None:
    folder, file = models["llama"]
    llm = LLM(str(file), num_blocks=64, tokenizer=str(folder))
    assert llm.tokenizer.name_or_path == str(folder)
    assert llm.runner.constraints._tokenizer_source == folder  # structured outputs use it too


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe", "mixtral", "olmoe"])
def test_a_mixture_of_experts_file_served_quantized_matches_its_folder(models, arch: str) -> None:
    """The experts' stacked Q8_0 tensors kept packed, from the file alone (its config from the metadata)."""
    folder, file = models[arch]
    quantized, weights = greedy(file, "auto")
    reference, _ = greedy(folder)
    assert weights.startswith("gguf Q8_0x"), weights
    assert [q[0] for q in quantized] == [r[0] for r in reference]
    assert sum(q == r for q, r in zip(quantized, reference, strict=True)) >= 11
