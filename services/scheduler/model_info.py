"""What the scheduler must know of the model: its tokenizer and limits, read from the checkpoint.

The scheduler never loads weights: the checkpoint's config and tokenizer files (services/checkpoint.py)
are enough to validate requests (vocabulary, context) and to detect EOS and stop strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedserve.services.checkpoint import load_checkpoint, load_tokenizer


@dataclass(slots=True)
class ModelInfo:
    path: Path
    tokenizer: Any | None
    vocab_size: int
    max_model_len: int
    eos_token_ids: list[int]
    rope_switch_at: int | None = None  # LongRoPE: see services/checkpoint.py


def load_model_info(model: str, max_model_len: int | None = None, tokenizer: str | None = None) -> ModelInfo:
    checkpoint = load_checkpoint(model, tokenizer)
    return ModelInfo(
        checkpoint.path,
        load_tokenizer(checkpoint.tokenizer_path),
        checkpoint.vocab_size,
        checkpoint.served_len(max_model_len),
        list(checkpoint.eos_token_ids),
        checkpoint.rope_switch_at,
    )
