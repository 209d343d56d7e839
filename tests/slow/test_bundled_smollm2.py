"""The bundled SmolLM2 is served straight from its GGUF: nothing converted or written but its tokenizer
(derived once from the file's metadata, then cached), which carries the chat template and tokenizes as
transformers' own GGUF reader does; and the model talks sense."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from harness.bundled_reference import transformers_bundled
from pagedserve.services.checkpoint import load_checkpoint, load_tokenizer
from pagedserve.services.worker.weights.bundled import find_bundled_gguf

from pagedserve import LLM, SamplingParams

pytestmark = pytest.mark.slow

TEXTS = ("What is the capital of France?", "  two spaces, ünïcödé, 12345 and <|im_end|>\n\n")


def test_the_tokenizer_is_derived_once_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path))
    checkpoint = load_checkpoint("smollm2-135m")
    assert checkpoint.path == find_bundled_gguf() and checkpoint.tokenizer_path == find_bundled_gguf()
    started = time.perf_counter()
    derived = load_tokenizer(checkpoint.tokenizer_path)
    first_s = time.perf_counter() - started
    started = time.perf_counter()
    cached = load_tokenizer(checkpoint.tokenizer_path)
    second_s = time.perf_counter() - started
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"], files
    assert second_s < first_s  # a ratio within one run: a loaded machine slows both alike
    reference, _ = transformers_bundled(with_model=False)
    for text in TEXTS:
        assert derived(text).input_ids == cached(text).input_ids == reference(text).input_ids
    assert derived.chat_template == cached.chat_template == reference.chat_template
    assert "<|im_start|>" in derived.chat_template
    assert (derived.eos_token, cached.eos_token) == ("<|im_end|>", "<|im_end|>")


def test_the_bundled_model_answers_sensibly() -> None:
    llm = LLM("smollm2-135m", num_blocks=64)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    answer = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=20))[0]
    assert "Paris" in answer.text
    assert answer.finish_reason == "stop"  # at <|im_end|>
