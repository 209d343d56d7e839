"""What the scheduler must know of the model: its tokenizer and limits, read from the checkpoint.

The scheduler never loads weights: config.json, generation_config.json and the tokenizer files are
enough to validate requests (vocabulary, context) and to detect EOS and stop strings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The bundled-model name resolves to a checkpoint folder (no torch, no weights read).
from pagedserve.services.worker.bundled import resolve_model


@dataclass(slots=True)
class ModelInfo:
    path: Path
    tokenizer: Any | None
    vocab_size: int
    max_model_len: int
    eos_token_ids: list[int]


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def load_tokenizer(model_path: Path) -> Any | None:
    """The checkpoint's tokenizer, or None for a checkpoint without one (tiny test models)."""
    if not any(
        (model_path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    ):
        return None
    from transformers import AutoTokenizer  # lazily: a second or two of imports

    return AutoTokenizer.from_pretrained(str(model_path))


def load_model_info(model: str, max_model_len: int | None = None) -> ModelInfo:
    path = resolve_model(model)
    config = json.loads((path / "config.json").read_text())
    text_config = config.get("text_config", config)
    eos = _as_list(text_config.get("eos_token_id"))
    gen_path = path / "generation_config.json"
    if gen_path.exists():
        eos = sorted(set(eos) | set(_as_list(json.loads(gen_path.read_text()).get("eos_token_id"))))
    context = int(text_config.get("max_position_embeddings", 2048))
    return ModelInfo(
        path,
        load_tokenizer(path),
        int(text_config["vocab_size"]),
        min(max_model_len or context, context),
        eos,
    )
