"""A checkpoint folder, read once the same way by every service: what the model is and what it serves.

The scheduler, the API, the engine and both workers (real and simulated) read config.json,
generation_config.json and the tokenizer files through this module, so they agree on the limits a
request is checked against. (The chat template is the tokenizer's: transformers finds it in
tokenizer_config.json or chat_template.jinja.) Nothing here loads weights or imports torch; only the bundled name's
first conversion (services/worker/weights/bundled.py) does, and only when that name is asked for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUNDLED_NAME = "smollm2-135m"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
# Sliding-window attention is not implemented: the served context is capped at the window instead,
# where full causal attention and the window's are the same thing. In these architectures the
# window applies only when the config also sets `use_sliding_window` (their configs carry a
# `sliding_window` size either way); in the others (Mistral) a `sliding_window` size is the window.
_WINDOW_NEEDS_FLAG = frozenset(
    {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"}
)
_DEFAULT_POSITIONS = 2048  # a config without max_position_embeddings (transformers' Llama default)


def resolve_model(name_or_path: str) -> Path:
    """A checkpoint folder passes through; the bundled name converts (once) or reuses its checkpoint."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if name_or_path == BUNDLED_NAME:
        from pagedserve.services.worker.weights.bundled import bundled_checkpoint  # lazily: conversion code

        return bundled_checkpoint()
    raise ValueError(
        f"model must be a checkpoint folder (config.json + *.safetensors) or the bundled name "
        f"{BUNDLED_NAME!r}; got {name_or_path!r}, which is neither (no such folder)"
    )


def read_config(folder: Path) -> dict[str, Any]:
    """config.json as a dict; FileNotFoundError names the folder when it is not a checkpoint."""
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} is not a Hugging Face checkpoint folder: no config.json")
    return json.loads(config_file.read_text())


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config nests the language model's fields under `text_config`."""
    return hf.get("text_config", hf)


def architecture(hf: dict[str, Any]) -> str:
    """The config's first named architecture (or its model_type); "" when it names neither."""
    names = hf.get("architectures") or []
    return str(names[0]) if names else str(hf.get("model_type", ""))


def sliding_window(hf: dict[str, Any]) -> int | None:
    """The attention window the config asks for, or None for full causal attention."""
    names = hf.get("architectures") or []
    if any(n in _WINDOW_NEEDS_FLAG for n in names) and not hf.get("use_sliding_window", False):
        return None
    window = text_config(hf).get("sliding_window")
    return int(window) if window else None


def context_length(hf: dict[str, Any]) -> int:
    """The longest context served exactly: the positions, capped at the sliding window."""
    positions = int(text_config(hf).get("max_position_embeddings", _DEFAULT_POSITIONS))
    window = sliding_window(hf)
    return min(positions, window) if window else positions


def token_ids(value: Any) -> tuple[int, ...]:
    """An `eos_token_id` field (absent, one id or a list) -> a tuple of ids."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: Path
    config: dict[str, Any]  # config.json as read
    architecture: str
    vocab_size: int
    max_model_len: int  # the positions capped at the sliding window (context_length)
    eos_token_ids: tuple[int, ...]  # config.json's and generation_config.json's, together
    tokenizer_path: Path | None  # the folder, when it holds a tokenizer (tiny test models may not)

    def served_len(self, configured: int | None) -> int:
        """The configured max_model_len, never above what the model serves."""
        return min(configured or self.max_model_len, self.max_model_len)


def read_checkpoint(folder: str | Path) -> Checkpoint:
    path = Path(folder)
    hf = read_config(path)
    text = text_config(hf)
    eos = set(token_ids(text.get("eos_token_id")))
    generation_file = path / "generation_config.json"
    if generation_file.is_file():
        eos |= set(token_ids(json.loads(generation_file.read_text()).get("eos_token_id")))
    has_tokenizer = any((path / f).exists() for f in TOKENIZER_FILES)
    return Checkpoint(
        path=path,
        config=hf,
        architecture=architecture(hf),
        vocab_size=_required_int(text, "vocab_size", path),
        max_model_len=context_length(hf),
        eos_token_ids=tuple(sorted(eos)),
        tokenizer_path=path if has_tokenizer else None,
    )


def load_checkpoint(model: str) -> Checkpoint:
    """A model name or folder (as ServeConfig.model holds it) -> its checkpoint."""
    return read_checkpoint(resolve_model(model))


def load_tokenizer(folder: Path | None) -> Any | None:
    """The transformers tokenizer in `folder` (a checkpoint's tokenizer_path), or None for none."""
    if folder is None or not any((Path(folder) / f).exists() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer  # lazily: a second or two of imports

    return AutoTokenizer.from_pretrained(str(folder))


def _required_int(config: dict[str, Any], key: str, path: Path) -> int:
    if not isinstance(config.get(key), int):
        raise ValueError(f"{path / 'config.json'}: field {key!r} must be an integer; got {config.get(key)!r}")
    return int(config[key])
