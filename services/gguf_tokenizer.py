"""A GGUF's tokenizer: derived from its metadata (vocabulary, merges, special tokens, chat template),
then kept in the cache for the next process that needs it.

The derivation is transformers' own (the builders behind `AutoTokenizer.from_pretrained(dir,
gguf_file=...)`), fed by our metadata reader (services/gguf_file.py): `from_pretrained` reads the file
with gguf.GGUFReader, 45 s for the bundled model's ~100K token strings on busy shared cores, where
this takes about 2 s. The result is saved as an ordinary tokenizer folder under
`$PAGEDSERVE_CACHE/gguf-tokenizers/`, keyed by a hash of the file's metadata bytes (which hold
everything the tokenizer is made of) and the transformers version, so the scheduler, the API and every
worker load it in well under a second after the first. A cache that cannot be written is no error:
the tokenizer is derived again in each process.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

import structlog

from pagedserve.services.gguf_file import GGUFError, read_header, split_parts
from pagedserve.services.model_cache import cache_root, publish_atomically

log = structlog.get_logger("pagedserve.tokenizer")

_FORMAT = "2"  # bump when the derivation below changes what it writes
_STRINGS = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.merges"})
_UNUSED = 5  # gguf.TokenType.UNUSED
_SPECIAL = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}


def has_tokenizer(path: Path) -> bool:
    """Whether the GGUF (the first part of a split set) carries a vocabulary."""
    return "tokenizer.ggml.model" in read_header(split_parts(path)[0]).metadata


def load_gguf_tokenizer(path: Path) -> Any:
    """The transformers tokenizer of the GGUF at `path`, from the cache when it is there."""
    from transformers import AutoTokenizer

    first = split_parts(Path(path))[0]
    cached = _cache_folder(first)
    if cached is not None and (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(str(cached))
    tokenizer = derive_tokenizer(first)
    _save(tokenizer, first, cached)
    return tokenizer


def cache_tokenizer(path: Path) -> None:
    """Derive and cache the tokenizer of the GGUF at `path` unless the cache holds it already: done
    once before a deployment's processes start, so that they all find it there."""
    first = split_parts(Path(path))[0]
    cached = _cache_folder(first)
    if cached is not None and not (cached / "tokenizer_config.json").is_file():
        _save(derive_tokenizer(first), first, cached)


def _save(tokenizer: Any, gguf: Path, cached: Path | None) -> None:
    if cached is None:
        return
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        publish_atomically(cached, lambda folder: tokenizer.save_pretrained(str(folder)))
    except OSError as e:  # a read-only or full cache: derived again next time
        log.warning("gguf_tokenizer_not_cached", gguf=str(gguf), cache=str(cached), error=str(e))


def derive_tokenizer(path: Path) -> Any:
    """Build the tokenizer from the metadata of `path` (a GGUF, the first part of a split set)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
            convert_gguf_tokenizer,
        )
    except ImportError:  # an older transformers: its own, slower reader
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    meta = read_header(path, _STRINGS).metadata
    if "tokenizer.ggml.model" not in meta:
        raise GGUFError(f"{path} carries no tokenizer (no tokenizer.ggml.model); pass --tokenizer FOLDER")
    found = {
        group: {name: meta[f"tokenizer.{key}"] for key, name in keys.items() if f"tokenizer.{key}" in meta}
        for group, keys in GGUF_TOKENIZER_MAPPING.items()
    }
    words, config = found["tokenizer"], found["tokenizer_config"]
    if words.get("tokenizer_type") == "llama":
        config.setdefault("add_bos_token", True)  # llama.cpp's default for a sentencepiece vocabulary
    if words.get("tokenizer_type") == "gpt2" and "merges" not in words and "scores" not in words:
        words["merges"] = []  # a writer leaves out an empty array: a byte-level vocabulary with no merges
    tokens = meta["tokenizer.ggml.tokens"]
    for name, key in _SPECIAL.items():
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and 0 <= token_id < len(tokens):
            config[name] = tokens[token_id]
    try:
        backend, extra = convert_gguf_tokenizer(meta["general.architecture"], words)
    except (ValueError, KeyError) as e:
        raise GGUFError(f"{path}: its tokenizer cannot be built: {e}") from e
    backend = _without_unused(backend, words.get("token_type") or [])
    return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)


def _without_unused(backend: Any, token_types: list[int]) -> Any:
    """The vocabulary without the tokens marked unused: llama.cpp's converter pads a vocabulary to the
    embedding's rows with them (`[PAD151665]`...). The model's own tokenizer has no such tokens, and
    llama.cpp renders them as nothing; kept, a model that samples one would print its name."""
    from tokenizers import Tokenizer

    unused = {i for i, kind in enumerate(token_types) if kind == _UNUSED}
    if not unused:
        return backend
    spec = json.loads(backend.to_str())
    model = spec["model"]
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        return backend  # a positional vocabulary (unigram) cannot lose entries
    dropped = {token for token, i in model["vocab"].items() if i in unused}
    model["vocab"] = {token: i for token, i in model["vocab"].items() if i not in unused}
    merges = model.get("merges") or []
    model["merges"] = [m for m in merges if not set(m.split(" ") if isinstance(m, str) else m) & dropped]
    return Tokenizer.from_str(json.dumps(spec))


def _cache_folder(path: Path) -> Path | None:
    """`$PAGEDSERVE_CACHE/gguf-tokenizers/<stem>-<hash>`: the hash covers the metadata bytes."""
    try:
        version = importlib.metadata.version("transformers")  # not imported: the supervisor asks too
        header = read_header(path)
        with path.open("rb") as f:
            digest = hashlib.sha256(f.read(header.metadata_end))
    except (OSError, importlib.metadata.PackageNotFoundError):
        return None
    digest.update(f"{_FORMAT} {version}".encode())
    stem = path.name.removesuffix(".gguf")
    return cache_root() / "gguf-tokenizers" / f"{stem}-{digest.hexdigest()[:16]}"
