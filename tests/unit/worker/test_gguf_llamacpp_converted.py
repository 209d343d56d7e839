"""A GGUF as users get one: written by llama.cpp's own converter (convert_hf_to_gguf.py), not by our
harness, for every architecture served as a folder (Llama, Mistral, Qwen2, Qwen3). Its metadata
names, tensor names, q/k row order and tokenizer keys are llama.cpp's; served alone it must be the
folder's model: the same config, EOS ids, tokens, chat template and greedy output. The mixtures of
experts (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE) too: the same architecture and greedy output.

The converter comes with the llama.cpp peer (ops/peers/setup_llamacpp.sh; LLAMACPP_VENV, default
.venv-llamacpp at the repo root): without it these tests are skipped, as the other llama.cpp tests are.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.gguf_models import CHAT_TEMPLATE
from harness.greedy_reference import random_prompts
from harness.llamacpp_convert import convert, find_converter
from harness.tiny_models import ARCHITECTURES, MOE_ARCHITECTURES, make_tiny_model

from pagedserve import LLM, SamplingParams
from pagedserve.ops.bench.llamacpp_server import llamacpp_venv
from pagedserve.services.checkpoint import load_checkpoint, load_tokenizer
from pagedserve.services.gguf_config import END_OF_GENERATION_TEXTS

PROMPTS = random_prompts(6, seed=11, max_len=40)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
MESSAGES = [{"role": "user", "content": "Say something."}, {"role": "assistant", "content": "Hi!"}]


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """arch -> (its checkpoint folder, llama.cpp's float32 GGUF of it); "llama-q8" the Llama as Q8_0."""
    from transformers import AutoTokenizer

    converter = find_converter(llamacpp_venv())
    if converter is None:  # an optional peer: CI and fresh clones have none
        pytest.skip(f"no llama.cpp converter in {llamacpp_venv()} (run ops/peers/setup_llamacpp.sh)")
    root = tmp_path_factory.mktemp("llamacpp-converted")
    out = {}
    for arch in ARCHITECTURES:
        folder = make_tiny_model(arch, root / arch)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        tokenizer.chat_template = CHAT_TEMPLATE  # the converter copies it into the file's metadata
        tokenizer.save_pretrained(folder)
        out[arch] = folder, convert(converter, folder, root / f"{arch}-f32.gguf", "f32")
    out["llama-q8"] = out["llama"][0], convert(converter, out["llama"][0], root / "llama-q8_0.gguf", "q8_0")
    for arch in MOE_ARCHITECTURES:
        # llama.cpp's converter keeps no clip_qkv for OLMoE (the released model has none) and maps no
        # dense layer inside a Qwen MoE (the released ones have none), so the tiny models have neither.
        overrides: dict = {"clip_qkv": None} if arch == "olmoe" else {}
        if arch.startswith("qwen"):
            overrides = {"mlp_only_layers": [], "decoder_sparse_step": 1}
        folder = make_tiny_model(arch, root / arch, **overrides)
        out[arch] = folder, convert(converter, folder, root / f"{arch}-f32.gguf", "f32")
    return out


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_llamacpps_file_serves_as_the_folder(converted, arch: str) -> None:
    folder, file = converted[arch]
    from_file, from_folder = load_checkpoint(str(file)), load_checkpoint(str(folder))
    expected = "LlamaForCausalLM" if arch == "mistral" else from_folder.architecture  # a `llama` GGUF
    assert from_file.architecture == expected
    assert (from_file.vocab_size, from_file.max_model_len) == (
        from_folder.vocab_size,
        from_folder.max_model_len,
    )
    # The file also ends on the tokens llama.cpp stops on by their text (transformers' Qwen2 tokenizer
    # adds <|endoftext|> to the tiny vocabulary); the folder's generation_config does not list it.
    vocab = load_tokenizer(folder).get_vocab()
    by_text = {i for t, i in vocab.items() if t in END_OF_GENERATION_TEXTS}
    assert set(from_file.eos_token_ids) == set(from_folder.eos_token_ids) | by_text
    file_llm = LLM(str(file), num_blocks=64, quantization="none")
    folder_llm = LLM(str(folder), num_blocks=64, quantization="none")
    chat = folder_llm.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert (
        file_llm.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == chat
    )
    assert file_llm.encode(chat) == folder_llm.encode(chat)
    prompts = [chat, *PROMPTS]
    file_out, folder_out = file_llm.generate(prompts, GREEDY), folder_llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in file_out] == [o.token_ids for o in folder_out]
    assert [o.text for o in file_out] == [o.text for o in folder_out]


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_llamacpps_mixture_of_experts_file_serves_as_the_folder(converted, arch: str) -> None:
    """Mixtral (llama.cpp's `llama` with experts), OLMoE and the Qwen MoE models, converted by llama.cpp
    and served alone: the folder's architecture and greedy tokens."""
    folder, file = converted[arch]
    assert load_checkpoint(str(file)).architecture == load_checkpoint(str(folder)).architecture
    file_out = LLM(str(file), num_blocks=64, quantization="none").generate(PROMPTS, GREEDY)
    folder_out = LLM(str(folder), num_blocks=64, quantization="none").generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in file_out] == [o.token_ids for o in folder_out]


def test_llamacpps_q8_0_file_stays_packed_and_matches_its_dense_load(converted) -> None:
    # The reference is the same file dequantized (the folder holds the unquantized weights): every
    # first token equal and 5 of 6 prompts throughout, the allowance of test_quantized_model.py.
    _, file = converted["llama-q8"]
    file_llm = LLM(str(file), num_blocks=64, quantization="auto")
    assert file_llm.runner.runtime["weights"].startswith("gguf Q8_0"), file_llm.runner.runtime["weights"]
    prompts = PROMPTS
    quantized = [o.token_ids for o in file_llm.generate(prompts, GREEDY)]
    dense = LLM(str(file), num_blocks=64, quantization="none")
    reference = [o.token_ids for o in dense.generate(prompts, GREEDY)]
    assert [q[0] for q in quantized] == [r[0] for r in reference]
    assert sum(q == r for q, r in zip(quantized, reference, strict=True)) >= len(prompts) - 1
