"""What the API must know of the model: the name it answers to, its tokenizer and its context.

The API never loads weights (nor torch, nor transformers): the tokenizer (services/text_tokenizer.py) renders chat templates and names the tokens
of logprobs; the scheduler stays the one that validates prompts against the context.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pagedserve.services.api.served_kind import ServedKind, served_kind
from pagedserve.services.checkpoint import load_checkpoint, served_name, text_config
from pagedserve.services.text_tokenizer import TextTokenizer, load_text_tokenizer
from pagedserve.shared.config import ServeConfig


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as one printable character; this maps them back."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF_CHAR = _byte_level_alphabet()


@dataclass(slots=True)
class ModelCard:
    name: str
    path: Path
    tokenizer: TextTokenizer | None  # None for a checkpoint without one
    max_model_len: int
    created: int  # seconds since the epoch, for /v1/models
    kind: ServedKind = ServedKind("generate")  # what it is served as (--runner): generate, embed, rerank
    hidden_size: int = 0  # the largest `dimensions` an embedding can have

    def token_text(self, token_id: int) -> str:
        """How one token reads on its own (logprobs name tokens by text, as OpenAI does)."""
        if self.tokenizer is None:
            return f"<{token_id}>"
        return self.tokenizer.decode([token_id])

    def top_map(self, top: Iterable[tuple[int, float]]) -> dict[str, float]:
        """(token id, logprob), most likely first -> the legacy `top_logprobs` {token text: logprob}.
        Tokens that read the same (ids past the tokenizer's, byte pieces) share one key: it keeps the
        likelier, not whichever came last."""
        out: dict[str, float] = {}
        for token_id, logprob in top:
            out.setdefault(self.token_text(token_id), logprob)
        return out

    def token_bytes(self, token_id: int) -> list[int]:
        """The token's own bytes: one byte of a multi-byte character is not text on its own, and its
        decoded form ("\ufffd") would hide which byte it is."""
        if self.tokenizer is not None:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece and all(ch in _BYTE_OF_CHAR for ch in piece):
                return [_BYTE_OF_CHAR[ch] for ch in piece]  # a byte-level BPE piece (GPT-2, Llama 3, SmolLM)
        return list(self.token_text(token_id).encode())

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return "".join(self.token_text(t) for t in token_ids)
        return self.tokenizer.decode(token_ids)


def load_model_card(config: ServeConfig) -> ModelCard:
    checkpoint = load_checkpoint(config.model, config.tokenizer)
    # The scheduler's limit too: both read it from the checkpoint, capped by the configured length.
    max_model_len = checkpoint.served_len(config.max_model_len)
    name = config.served_model_name or served_name(config.model)
    created = int(checkpoint.modified)
    tokenizer = load_text_tokenizer(checkpoint.tokenizer_path)
    kind = served_kind(config, checkpoint.path, tokenizer)
    hidden_size = int(text_config(checkpoint.config).get("hidden_size", 0))
    return ModelCard(name, checkpoint.path, tokenizer, max_model_len, created, kind, hidden_size)
