"""Constraints compiled against one model's vocabulary, once per distinct constraint (bounded cache).

A compiled grammar holds, per grammar state, which tokens of the vocabulary may come next; compiling
is the costly part (milliseconds for a small schema, more for a large one), matching is cheap. The
cache is an LRU by count on top of xgrammar's own byte-bounded cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xgrammar as xgr

from pagedserve.services.constraints.grammar import grammar_of
from pagedserve.shared.protocol.constraints import StructuredOutputs

DEFAULT_CACHE_ENTRIES = 256
DEFAULT_CACHE_BYTES = 256 << 20


def tokenizer_info(tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> xgr.TokenizerInfo:
    """The vocabulary as xgrammar needs it; `vocab_size` is the model's (its logits' width, which may
    be padded past the tokenizer's own tokens: those are never allowed)."""
    return xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) or None
    )


class ConstraintCompiler:
    def __init__(
        self,
        info: xgr.TokenizerInfo,
        max_entries: int = DEFAULT_CACHE_ENTRIES,
        max_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.info = info
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=max_bytes)
        self._cache: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._max_entries = max_entries
        self.hits = 0
        self.misses = 0

    @classmethod
    def for_model(
        cls, tokenizer_source: str | Path | None, vocab_size: int, stop_token_ids: Sequence[int]
    ) -> ConstraintCompiler:
        """tokenizer_source: a checkpoint's tokenizer_path (a folder, or a GGUF: services/checkpoint.py)."""
        # Lazily: only a worker that meets a constraint pays for the tokenizer.
        from pagedserve.services.checkpoint import load_tokenizer

        tokenizer = load_tokenizer(Path(tokenizer_source) if tokenizer_source is not None else None)
        if tokenizer is None:
            raise ValueError("structured outputs need the model's tokenizer, and this model has none")
        return cls(tokenizer_info(tokenizer, vocab_size, stop_token_ids))

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    def compile(self, spec: StructuredOutputs) -> xgr.CompiledGrammar:
        key = spec.cache_key()
        compiled = self._cache.get(key)
        if compiled is not None:
            self.hits += 1
            self._cache.move_to_end(key)
            return compiled
        self.misses += 1
        compiled = self._compiler.compile_grammar(grammar_of(spec))
        self._cache[key] = compiled
        if len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)
        return compiled
