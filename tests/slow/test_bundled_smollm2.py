"""The bundled SmolLM2: converted once into a float32 checkpoint with a chat template, and it talks sense."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.weights import bundled

pytestmark = pytest.mark.slow


@dataclass
class TwoResolutions:
    first: Path
    second: Path
    first_s: float  # the conversion
    second_s: float  # a look at the cache
    converted_into: list[Path] = field(default_factory=list)


@pytest.fixture(scope="module")
def resolved_twice(tmp_path_factory: pytest.TempPathFactory) -> TwoResolutions:
    """Resolve the bundled name twice in an empty cache, counting conversions (one real one, ~30 s)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("PAGEDSERVE_CACHE", str(tmp_path_factory.mktemp("cache")))
    converted_into: list[Path] = []
    convert = bundled.convert_gguf

    def counting_convert(gguf: Path, folder: Path) -> None:
        converted_into.append(folder)
        convert(gguf, folder)

    patch.setattr(bundled, "convert_gguf", counting_convert)
    try:
        started = time.perf_counter()
        first = resolve_model("smollm2-135m")
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        second = resolve_model("smollm2-135m")
        return TwoResolutions(first, second, first_s, time.perf_counter() - started, converted_into)
    finally:
        patch.undo()


def test_resolving_twice_converts_once(resolved_twice: TwoResolutions) -> None:
    assert len(resolved_twice.converted_into) == 1
    assert resolved_twice.first == resolved_twice.second
    # A ratio within one run, so a loaded machine slows both alike.
    assert resolved_twice.second_s < resolved_twice.first_s / 20


def test_the_checkpoint_is_float32_with_a_chat_template(resolved_twice: TwoResolutions) -> None:
    from safetensors import safe_open
    from transformers import AutoTokenizer

    with safe_open(resolved_twice.first / "model.safetensors", "pt") as weights:
        names = weights.keys()  # a safe_open handle is not iterable itself
        assert {weights.get_slice(name).get_dtype() for name in names} == {"F32"}
    tokenizer = AutoTokenizer.from_pretrained(resolved_twice.first)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"


def test_the_checkpoint_answers_sensibly_with_transformers(resolved_twice: TwoResolutions) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolved_twice.first)
    model = AutoModelForCausalLM.from_pretrained(resolved_twice.first, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    output = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
