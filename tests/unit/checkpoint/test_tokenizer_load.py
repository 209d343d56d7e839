"""load_tokenizer: the class AutoTokenizer would pick, loaded without AutoTokenizer's detour through the
model config (and torch), so an API or scheduler restart does not pay for it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness.pooling_models import make_tiny_reranker
from transformers import AutoTokenizer

from pagedserve.services.checkpoint import load_tokenizer

TEXTS = ["hello", " yes and no", "héllo\n\n  <|im_start|>x", ""]
TURNS = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module", params=["byte", "words"])
def folder(request, tiny_model, tmp_path_factory):
    if request.param == "byte":
        return tiny_model("llama")
    return make_tiny_reranker(tmp_path_factory.mktemp("tok") / "reranker")


def test_the_same_class_and_ids_as_autotokenizer(folder):
    ours, theirs = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    assert type(ours) is type(theirs)
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text)
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
    assert ours.convert_tokens_to_ids(["yes", "no"]) == theirs.convert_tokens_to_ids(["yes", "no"])


def test_loading_a_tokenizer_imports_no_torch(folder):
    code = (
        "import sys; from pagedserve.services.checkpoint import load_tokenizer; "
        f"t = load_tokenizer({str(folder)!r}); print(len(t.encode('hi')) > 0, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]
