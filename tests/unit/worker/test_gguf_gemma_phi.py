"""Gemma 2, Gemma 3 and Phi-3 served from the GGUF llama.cpp's own converter writes of them.

Each tiny checkpoint (harness/tiny_models.py FAMILIES, with the settings a GGUF can state: llama.cpp's
files carry no `query_pre_attn_scalar`, so it is the head size, and no Gemma 3 sliding pattern, so it is
6) is converted by convert_hf_to_gguf.py and served from the file alone. The reference is transformers
itself: on the folder for a float32 file, and on the folder with the file's own weights (F16 or
quantized, dequantized by the `gguf` package) for the others. Float32 and F16 must give transformers'
greedy tokens exactly; Q8_0 and Q4_0 (kept packed, the kernel's int8 activations) every first token and
all but one prompt token for token, the allowance of test_quantized_model.py.

Windows of 13 / 11 / 29 positions against prompts of up to 70 tokens; Gemma 2 soft-caps attention and
logits; Gemma 3 has a local rotary base of its own (`rope.freq_base_swa`), a linearly scaled global one,
q/k norms and norms stored as 1 + w; Phi-3 fuses qkv and gate/up, rotates half of each head, and
`phi3-longrope` reads its LongRoPE factors from the file's tensors (prompts cross its original 48).

The converter comes with the llama.cpp peer (ops/peers/setup_llamacpp.sh): without it these tests are
skipped, as the other llama.cpp tests are. test_gguf_gemma_phi_config.py checks the metadata rules
without it.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from harness.llamacpp_convert import convert_all, dequantized_folder, find_converter
from harness.parity import transformers_greedy
from harness.tiny_models import make_tiny_model

from pagedserve import LLM, SamplingParams
from pagedserve.ops.bench.llamacpp_server import llamacpp_venv
from pagedserve.ops.models.requantize_gguf import requantize
from pagedserve.services.checkpoint import load_checkpoint
from pagedserve.services.worker.layers.rope import RopeConfig
from pagedserve.services.worker.models.registry import parse_config

MAX_TOKENS = 16
_rng = random.Random(5)
# Byte tokens only (3..258): Gemma 3's file has the tokenizer's 262 rows, not the padded 320.
PROMPTS = [[_rng.randrange(3, 259) for _ in range(n)] for n in (3, 12, 20, 37, 52, 70)]
# What a GGUF can say: query_pre_attn_scalar = head_dim; Gemma 3's default pattern of 6 over 7 layers
# (0-4 and 6 slide); Gemma 3's converter drops embedding rows past the tokenizer's 262 tokens.
CASES: dict[str, tuple[str, dict]] = {
    "gemma2": ("gemma2", {"query_pre_attn_scalar": 24}),
    "gemma3": (
        "gemma3",
        {"query_pre_attn_scalar": 16, "num_hidden_layers": 7, "sliding_window_pattern": 6, "vocab_size": 262},
    ),
    "phi3": ("phi3", {}),
    "phi3-longrope": ("phi3-longrope", {}),
}
# Quantized: every matrix's rows whole 32-weight blocks.
_BLOCKS = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "query_pre_attn_scalar": 16,  # Gemma: the head size, as the file says
}
QUANTIZED = [("gemma2", "Q8_0"), ("gemma2", "Q4_0"), ("gemma3", "Q4_0"), ("phi3", "Q8_0"), ("phi3", "Q4_0")]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """name -> (checkpoint folder, llama.cpp's GGUF of it): every case's float32 file, Gemma 3's F16
    one, and the quantized ones (Q8_0 by the converter, Q4_0 requantized from it by the gguf package),
    converted in one subprocess."""
    converter = find_converter(llamacpp_venv())
    if converter is None:  # an optional peer: CI and fresh clones have none
        pytest.skip(f"no llama.cpp converter in {llamacpp_venv()} (run ops/peers/setup_llamacpp.sh)")
    root = tmp_path_factory.mktemp("gguf-gemma-phi")
    out: dict[str, tuple[Path, Path]] = {}
    for case, (arch, overrides) in CASES.items():
        out[case] = make_tiny_model(arch, root / case, **overrides), root / f"{case}-f32.gguf"
    out["gemma3-F16"] = out["gemma3"][0], root / "gemma3-f16.gguf"
    for arch in {a for a, _ in QUANTIZED}:
        folder = make_tiny_model(arch, root / f"{arch}-blocks", **{**CASES[arch][1], **_BLOCKS})
        out[f"{arch}-Q8_0"] = folder, root / f"{arch}-q8_0.gguf"
    jobs = [(folder, file, file.stem.rsplit("-", 1)[1]) for folder, file in out.values()]
    convert_all(converter, jobs)
    for arch, type_name in QUANTIZED:
        if type_name != "Q8_0":
            folder, q8 = out[f"{arch}-Q8_0"]
            out[f"{arch}-{type_name}"] = folder, root / f"{arch}-{type_name.lower()}.gguf"
            requantize(q8, out[f"{arch}-{type_name}"][1], type_name)
    return out


def _rope(rope: RopeConfig | None) -> tuple | None:
    """A rotary's settings, its LongRoPE factors as the float32 values they are computed in."""
    if rope is None:
        return None
    params = {k: np.float32(v).tolist() if k.endswith("_factor") else v for k, v in rope.params.items()}
    return rope.rope_type, rope.theta, rope.partial, sorted(params.items())


def _served(file: Path, quantization: str) -> tuple[list[list[int]], str]:
    llm = LLM(str(file), num_blocks=128, quantization=quantization)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, params)], llm.runner.runtime["weights"]


@pytest.mark.parametrize("case", CASES)
def test_float32_file_gives_transformers_tokens(files, case) -> None:
    folder, file = files[case]
    from_file, from_folder = load_checkpoint(str(file)), load_checkpoint(str(folder))
    assert from_file.architecture == from_folder.architecture
    ours, theirs = parse_config(from_file.config), parse_config(from_folder.config)
    assert ours.layer_windows == theirs.layer_windows
    assert (_rope(ours.rope), _rope(ours.sliding_rope), ours.scale) == (
        _rope(theirs.rope),
        _rope(theirs.sliding_rope),
        theirs.scale,
    )
    assert (ours.attn_logit_softcap, ours.final_logit_softcap) == (
        theirs.attn_logit_softcap,
        theirs.final_logit_softcap,
    )
    assert ours.tie_word_embeddings == theirs.tie_word_embeddings
    served, weights = _served(file, "none")
    assert weights == "float32"
    assert served == transformers_greedy(folder, PROMPTS, MAX_TOKENS)


def test_f16_file_gives_transformers_tokens_on_its_weights(files, tmp_path) -> None:
    folder, file = files["gemma3-F16"]
    served, _ = _served(file, "none")
    assert served == transformers_greedy(
        dequantized_folder(folder, file, tmp_path / "reference"), PROMPTS, MAX_TOKENS
    )


@pytest.mark.parametrize(("arch", "type_name"), QUANTIZED, ids=[f"{a}-{t}" for a, t in QUANTIZED])
def test_quantized_file_stays_packed_near_transformers_on_its_weights(
    files, tmp_path, arch, type_name
) -> None:
    folder, file = files[f"{arch}-{type_name}"]
    served, weights = _served(file, "gguf")
    assert weights.startswith(f"gguf {type_name}"), weights
    reference = transformers_greedy(
        dequantized_folder(folder, file, tmp_path / "reference"), PROMPTS, MAX_TOKENS
    )
    assert [s[0] for s in served] == [r[0] for r in reference]
    same = sum(s == r for s, r in zip(served, reference, strict=True))
    assert same >= len(PROMPTS) - 1, f"{same}/{len(PROMPTS)} prompts matched token for token"
