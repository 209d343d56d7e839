"""A checkpoint's tokenizer as the API process uses it: text <-> token ids and chat prompts, with the
`tokenizers` library and jinja2 only (no transformers, no torch: about 2 s of every start).

What transformers makes of a checkpoint's tokenizer files is more than tokenizer.json: the class
named in tokenizer_config.json may add special tokens, put a BOS/EOS post-processor in, patch a
pre-tokenizer; decode may clean up spaces; the template sees the special tokens by name. Rather than
redo that per class and per transformers version, the first process that loads a checkpoint's
tokenizer builds it with transformers (services/checkpoint.py `load_tokenizer`) and exports what
it ended up as: the backend's tokenizer.json as transformers holds it, and `attributes.json` (the
special tokens, the chat template, the unknown token's id, whether decode cleans up spaces). Later
processes (a restarted API above all) read that export. It lives in
`$PAGEDSERVE_CACHE/text-tokenizers/<name>-<hash>/`, keyed by the checkpoint's files (a GGUF's
metadata bytes), the transformers version and this module's format, so a changed checkpoint or an
upgraded transformers is exported again. A cache that cannot be written is no error: that process
uses the tokenizer it built.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from tokenizers import Tokenizer

from pagedserve.services.chat_jinja import pick_template, render_template
from pagedserve.services.model_cache import cache_root, publish_atomically

log = structlog.get_logger("pagedserve.tokenizer")

_FORMAT = "1"  # bump when what is exported, or how it is read, changes
_BACKEND_FILE, _ATTRIBUTES_FILE = "tokenizer.json", "attributes.json"
_WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")
_LARGEST_HASHED = 64 << 20  # a folder's files past this are weights, not tokenizer files
_CLEANUPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


@dataclass(slots=True)
class TextTokenizer:
    backend: Tokenizer
    special_tokens: dict[str, Any]  # bos_token, eos_token, ... by name: variables of the chat template
    chat_template: str | dict[str, str] | None
    unk_token_id: int | None
    special_ids: frozenset[int]
    clean_up_spaces: bool  # transformers' clean_up_tokenization after decoding (WordPiece checkpoints)
    _frame: tuple[list[int], list[int]] | None = field(default=None, repr=False)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text = self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        if self.clean_up_spaces:
            for spaced, tight in _CLEANUPS:
                text = text.replace(spaced, tight)
        return text

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> Any:
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        if isinstance(tokens, str):
            found = self.backend.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def build_inputs_with_special_tokens(self, token_ids: Sequence[int]) -> list[int]:
        """`token_ids` framed as encode(add_special_tokens=True) frames a text (BOS before, EOS after:
        whatever the post-processor adds)."""
        if self._frame is None:
            self._frame = self._special_frame()
        before, after = self._frame
        return [*before, *token_ids, *after]

    def _special_frame(self) -> tuple[list[int], list[int]]:
        bare = self.encode("x", add_special_tokens=False)
        framed = self.encode("x", add_special_tokens=True)
        for start in range(len(framed) - len(bare) + 1):
            if framed[start : start + len(bare)] == bare:
                return framed[:start], framed[start + len(bare) :]
        return [], []

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text, as transformers' apply_chat_template(tokenize=False) renders it."""
        if self.chat_template is None:
            raise ValueError("the model has no chat template")
        return render_template(
            pick_template(self.chat_template, tools),
            messages,
            {**self.special_tokens, **template_kwargs},
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )

    @classmethod
    def from_transformers(cls, hf: Any) -> TextTokenizer:
        """What a transformers tokenizer (a fast one: it has a `tokenizers` backend) is made of."""
        backend_of = getattr(hf, "backend_tokenizer", None)
        if backend_of is None:
            raise ValueError(f"{type(hf).__name__} has no `tokenizers` backend (no tokenizer.json to build)")
        backend = Tokenizer.from_str(backend_of.to_str())
        backend.encode_special_tokens = bool(backend_of.encode_special_tokens)
        return cls._made(backend, _attributes(hf))

    @classmethod
    def _made(cls, backend: Tokenizer, attrs: dict[str, Any]) -> TextTokenizer:
        backend.no_truncation()  # transformers encodes without either unless asked
        backend.no_padding()
        backend.encode_special_tokens = bool(attrs["split_special_tokens"])
        return cls(
            backend=backend,
            special_tokens=dict(attrs["special_tokens"]),
            chat_template=attrs["chat_template"],
            unk_token_id=attrs["unk_token_id"],
            special_ids=frozenset(attrs["special_ids"]),
            clean_up_spaces=bool(attrs["clean_up_spaces"]),
        )

    @classmethod
    def read(cls, folder: Path) -> TextTokenizer:
        attrs = json.loads((folder / _ATTRIBUTES_FILE).read_text())
        return cls._made(Tokenizer.from_file(str(folder / _BACKEND_FILE)), attrs)

    def write(self, folder: Path) -> None:
        attrs = {
            "special_tokens": self.special_tokens,
            "chat_template": self.chat_template,
            "unk_token_id": self.unk_token_id,
            "special_ids": sorted(self.special_ids),
            "clean_up_spaces": self.clean_up_spaces,
            "split_special_tokens": self.backend.encode_special_tokens,
        }
        (folder / _BACKEND_FILE).write_text(self.backend.to_str())
        (folder / _ATTRIBUTES_FILE).write_text(json.dumps(attrs))


def _attributes(hf: Any) -> dict[str, Any]:
    clean_up = bool(getattr(hf, "clean_up_tokenization_spaces", False))
    override = getattr(hf, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", None)
    if clean_up and override is not None:  # transformers 5 skips the clean-up for BPE unless overridden
        clean_up = type(hf.backend_tokenizer.model).__name__ != "BPE" or bool(override)
    return {
        "special_tokens": dict(hf.special_tokens_map),
        "chat_template": getattr(hf, "chat_template", None),
        "unk_token_id": hf.unk_token_id,
        "special_ids": list(hf.all_special_ids),
        "clean_up_spaces": clean_up,
        "split_special_tokens": bool(hf.backend_tokenizer.encode_special_tokens),
    }


def load_text_tokenizer(source: Path | None) -> TextTokenizer | None:
    """The tokenizer of a checkpoint's tokenizer_path (a folder, or a GGUF whose metadata holds it),
    from its export when there is one; None for a checkpoint without a tokenizer."""
    if source is None:
        return None
    source = Path(source)
    export = _export_folder(source)
    if export is not None and (export / _ATTRIBUTES_FILE).is_file():
        try:
            return TextTokenizer.read(export)
        except Exception as e:  # noqa: BLE001 -- a damaged export (any parse error): build it again
            log.warning("text_tokenizer_export_unreadable", export=str(export), error=str(e))
    from pagedserve.services.checkpoint import load_tokenizer  # lazily: transformers, once per export

    hf = load_tokenizer(source)
    if hf is None:
        return None
    tokenizer = TextTokenizer.from_transformers(hf)
    if export is not None:
        try:
            export.parent.mkdir(parents=True, exist_ok=True)
            publish_atomically(export, tokenizer.write)
        except OSError as e:  # a read-only or full cache: built again next time
            log.warning("text_tokenizer_not_exported", export=str(export), error=str(e))
    return tokenizer


def _export_folder(source: Path) -> Path | None:
    """`$PAGEDSERVE_CACHE/text-tokenizers/<name>-<hash>`, or None when the key cannot be read."""
    try:
        version = importlib.metadata.version("transformers")  # the version only: no import
        digest = hashlib.sha256(f"{_FORMAT} {version}".encode())
        if source.suffix == ".gguf":
            from pagedserve.services.gguf_file import read_header, split_parts

            first = split_parts(source)[0]
            with first.open("rb") as f:
                digest.update(f.read(read_header(first).metadata_end))
            name = first.name.removesuffix(".gguf")
        else:
            for file in _tokenizer_files(source):
                digest.update(f"{file.relative_to(source)} {file.stat().st_size}\n".encode())
                digest.update(file.read_bytes())
            name = source.name
    except (OSError, ValueError, importlib.metadata.PackageNotFoundError):
        return None
    return cache_root() / "text-tokenizers" / f"{name}-{digest.hexdigest()[:16]}"


def _tokenizer_files(folder: Path) -> list[Path]:
    """Every file of the folder (and of its additional_chat_templates/) that is not weights."""
    files = [*folder.iterdir(), *(folder / "additional_chat_templates").glob("*")]
    return sorted(
        f
        for f in files
        if f.is_file() and not f.name.endswith(_WEIGHTS) and f.stat().st_size <= _LARGEST_HASHED
    )
