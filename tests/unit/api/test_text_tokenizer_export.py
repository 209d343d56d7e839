"""load_text_tokenizer: built with transformers once per checkpoint, then read from its export with
`tokenizers` and jinja2 alone (what makes a restarted API process start fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness.gguf_models import CHAT_TEMPLATE
from harness.tiny_models import save_byte_tokenizer

from pagedserve.services.text_tokenizer import load_text_tokenizer

TURNS = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tok"
    save_byte_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return folder


def _exports(folder: Path) -> list[Path]:
    root = folder.parent / "cache" / "text-tokenizers"
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


def test_the_first_load_exports_and_a_changed_checkpoint_is_exported_again(folder):
    first = load_text_tokenizer(folder)
    assert first is not None and len(_exports(folder)) == 1
    again = load_text_tokenizer(folder)
    assert again is not None and again.render_chat(TURNS) == first.render_chat(TURNS)
    assert len(_exports(folder)) == 1  # read, not exported again
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    changed = load_text_tokenizer(folder)
    assert changed is not None and changed.render_chat(TURNS) == "[Hi]"
    assert len(_exports(folder)) == 2


def test_a_damaged_export_is_built_again(folder):
    ids = load_text_tokenizer(folder).encode("hi")
    (export,) = _exports(folder)
    (export / "tokenizer.json").write_text("{not json")
    rebuilt = load_text_tokenizer(folder)
    assert rebuilt is not None and rebuilt.encode("hi") == ids and len(ids) == 2


def test_a_folder_without_a_tokenizer_has_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path / "cache"))
    assert load_text_tokenizer(None) is None
    assert load_text_tokenizer(tmp_path) is None


def test_reading_an_export_imports_neither_transformers_nor_torch(folder):
    load_text_tokenizer(folder)
    code = (
        "import sys; from pagedserve.services.text_tokenizer import load_text_tokenizer; "
        f"t = load_text_tokenizer({str(folder)!r}); "
        "print(t.render_chat([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True).count('<|im_start|>'), "
        "'transformers' in sys.modules, 'torch' in sys.modules)"
    )
    env = {"PAGEDSERVE_CACHE": str(folder.parent / "cache"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["2", "False", "False"]
