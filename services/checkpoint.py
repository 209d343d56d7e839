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


def context_length(hf: dict[str, Any]) -> int:
    """The longest context served exactly: the model's positions. Sliding-window layers (Mistral,
    Qwen2/3 with use_sliding_window, Gemma 2/3, Phi-3) attend exactly over their window in every
    attention backend, so a window no longer caps the context."""
    return int(text_config(hf).get("max_position_embeddings", _DEFAULT_POSITIONS))


def rope_switch_at(hf: dict[str, Any]) -> int | None:
    """LongRoPE (Phi-3 / Phi-4's `longrope`, older configs' `su`, Phi-3's `yarn`): the context length past
    which transformers rotates every position of a sequence with the long factors instead of the short
    ones (recomputing what it had cached); None for any other rotary. The scheduler recomputes a
    request that crosses it and keeps such requests' prefix-cache entries apart (docs/architectures-gemma-phi.md)."""
    text = text_config(hf)
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    kind = params.get("rope_type") or params.get("type")
    if kind not in ("longrope", "su") and not (kind == "yarn" and architecture(hf) == "Phi3ForCausalLM"):
        return None
    original = text.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
    return int(original or text.get("max_position_embeddings", _DEFAULT_POSITIONS))


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
    max_model_len: int  # the model's positions (context_length)
    rope_switch_at: int | None  # LongRoPE's original length (rope_switch_at), else None
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
        rope_switch_at=rope_switch_at(hf),
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
    return _folder_tokenizer(Path(folder))


def _folder_tokenizer(folder: Path) -> Any:
    """The class tokenizer_config.json names, imported alone. AutoTokenizer would pick that same class
    but first import torch to read the model's config: 3 s of every API and scheduler start."""
    import transformers  # lazily: a second of imports

    config_file = folder / "tokenizer_config.json"
    name = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.is_file() else None
    for candidate in [f"{name.removesuffix('Fast')}Fast", name.removesuffix("Fast")] if name else []:
        try:  # AutoTokenizer's order: the fast class first
            cls = getattr(transformers, candidate)
        except (AttributeError, ImportError):
            continue
        return cls.from_pretrained(str(folder))
    from transformers import AutoTokenizer  # no class named, or not one of transformers': its own search

    return AutoTokenizer.from_pretrained(str(folder))


def _required_int(config: dict[str, Any], key: str, path: Path) -> int:
    if not isinstance(config.get(key), int):
        raise ValueError(f"{path / 'config.json'}: field {key!r} must be an integer; got {config.get(key)!r}")
    return int(config[key])
