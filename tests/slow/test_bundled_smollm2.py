"""The bundled SmolLM2 is served straight from its GGUF: nothing converted or written but its tokenizer
(derived once from the file's metadata, then cached), which carries the chat template and tokenizes as
transformers' own GGUF reader does; and the model talks sense."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.bundled_reference import transformers_bundled

from pagedserve import LLM, SamplingParams
from pagedserve.services import gguf_tokenizer
from pagedserve.services.checkpoint import load_checkpoint, load_tokenizer
from pagedserve.services.model_cache import cache_root
from pagedserve.services.worker.weights.bundled import find_bundled_gguf

pytestmark = pytest.mark.slow

TEXTS = ("What is the capital of France?", "  two spaces, ünïcödé, 12345 and <|im_end|>\n\n")


def test_the_tokenizer_is_derived_once_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path))
    checkpoint = load_checkpoint("smollm2-135m")
    assert checkpoint.path == find_bundled_gguf() and checkpoint.tokenizer_path == find_bundled_gguf()
    derived = load_tokenizer(checkpoint.tokenizer_path)
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"], files

    def derive_again(path: Path) -> None:
        raise AssertionError(f"derived {path} again: the cache was not read")

    monkeypatch.setattr(gguf_tokenizer, "derive_tokenizer", derive_again)
    cached = load_tokenizer(checkpoint.tokenizer_path)
    reference, _ = transformers_bundled(with_model=False)
    for text in TEXTS:
        assert derived(text).input_ids == cached(text).input_ids == reference(text).input_ids
    assert derived.chat_template == cached.chat_template == reference.chat_template
    assert "<|im_start|>" in derived.chat_template
    assert (derived.eos_token, cached.eos_token) == ("<|im_end|>", "<|im_end|>")


def test_the_bundled_model_answers_sensibly_and_nothing_but_its_tokenizer_is_written() -> None:
    def written() -> set[Path]:
        return {p for p in cache_root().rglob("*") if p.is_file() and "kernels" not in p.parts}

    before = written()
    llm = LLM("smollm2-135m", num_blocks=64)
    assert llm.runner.runtime["weights"].startswith("gguf Q4_1"), llm.runner.runtime["weights"]
    new = written() - before
    assert all("gguf-tokenizers" in p.parts for p in new), new  # no config, no converted weights
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    answer = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=20))[0]
    assert "Paris" in answer.text
    assert answer.finish_reason == "stop"  # at <|im_end|>
