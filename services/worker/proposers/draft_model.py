"""A draft model proposes: a smaller checkpoint with the target's vocabulary, run greedily by the same
worker on a paged KV pool of its own.

Each proposing decode's draft sequence keeps its K/V in the draft pool (blocks from this module's free
list; the block manager never sees them: nothing but this worker reads them). One `propose_batch` runs
k rounds over all proposing requests at once:

- round 0 catches the draft up: the request's known tokens it has no K/V for (the whole prompt the
  first time, afterwards the one or two tokens the last step added) and the first proposal from the
  last row's argmax;
- rounds 1..k-1 each feed the previous proposal and take the next argmax, one row per request.

Proposals are the draft's argmax, so q is one-hot and verification (verification.py) keeps the
target's output exactly. The K/V written for proposals the target then accepts stays valid (same
tokens at the same positions); from the first rejected one on it is written again next time.

A request's draft blocks go back when the worker forgets it (finished, aborted, preempted) and with
the worker's process; a request the pool has no room for proposes nothing that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from pagedserve.kernels.attention import AttentionBackend
from pagedserve.services.checkpoint import load_tokenizer, resolve_model
from pagedserve.services.worker.kv_cache import KVCache, KVCacheShape
from pagedserve.services.worker.layers.rope import longrope_tokens
from pagedserve.services.worker.packed_batch import RequestState, pack_batch
from pagedserve.services.worker.weights.loader import load_model
from pagedserve.shared.paging import blocks_for


class DraftVocabularyMismatch(ValueError):
    """The draft model's tokens are not the target's: its proposals would mean other text."""


@dataclass(slots=True)
class DraftSequence:
    """One request's draft K/V: positions [0, len(prefix) + len(drafts)) are written."""

    block_ids: list[int] = field(default_factory=list)
    num_known: int = 0  # the request's known tokens (prompt + outputs) when it last proposed
    drafts: list[int] = field(default_factory=list)  # proposals written after them (the last has no K/V)


@dataclass(frozen=True, slots=True)
class TargetFacts:
    """What the draft must agree with, and how the worker runs the target."""

    vocab_size: int
    tokenizer_path: Path | None
    backend: AttentionBackend
    dtype: str
    device: torch.device
    block_size: int
    kv_dtype: torch.dtype
    num_blocks: int  # the draft pool's size, in blocks of block_size
    quantization: str  # as the target's (`auto`: a GGUF draft keeps its quantized weights)
    quant_activations: str | None = None  # as the target's (None: from the environment)


class DraftModelProposer:
    name = "draft_model"

    def __init__(self, model_path: str, target: TargetFacts, prepack: bool = True) -> None:
        loaded = load_model(
            resolve_model(model_path),
            target.backend,
            dtype=target.dtype,
            device=target.device,
            quantization=target.quantization,
            quant_activations=target.quant_activations,
        )
        check_same_vocabulary(model_path, loaded.config.vocab_size, loaded.tokenizer_path, target)
        self.model = loaded.model
        if prepack:
            self.model.prepack_weights()
        cfg = loaded.config
        self.max_model_len = cfg.max_model_len
        self.vocab_size = target.vocab_size  # the draft's argmax never leaves the target's ids
        self.block_size = target.block_size
        self.device = target.device
        shape = KVCacheShape(
            cfg.num_layers, target.block_size, cfg.num_kv_heads, cfg.head_dim, target.kv_dtype
        )
        self.kv_cache = KVCache(shape, target.num_blocks, target.device)
        self.free_blocks = list(range(target.num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self.sequences: dict[str, DraftSequence] = {}

    @property
    def num_blocks(self) -> int:
        return self.kv_cache.num_blocks

    @property
    def blocks_in_use(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    # ------------------------------------------------------------------ the Proposer protocol

    def propose(self, state: RequestState, k: int) -> list[int]:
        return self.propose_batch([(state, k)])[0]

    def finished(self, state: RequestState) -> None:
        seq = self.sequences.pop(state.request_id, None)
        if seq is not None:
            self.free_blocks += reversed(seq.block_ids)

    @torch.inference_mode()
    def propose_batch(self, items: list[tuple[RequestState, int]]) -> list[list[int]]:
        """Up to k tokens per (request, k), in one forward per round for all of them."""
        proposals: list[list[int]] = [[] for _ in items]
        rows: list[tuple[int, RequestState, int]] = []  # (index into items, draft view, k)
        for i, (state, k) in enumerate(items):
            view = self._draft_view(state, k)
            if view is not None:
                rows.append((i, view, k))
        for round_ in range(max((k for _, _, k in rows), default=0)):
            active = [(i, view, k) for i, view, k in rows if k > round_]
            scheduled = [(view, view.num_tokens - view.num_computed_tokens) for _, view, _ in active]
            tokens = self._argmax(scheduled)
            for (i, view, _k), (_, n), token in zip(active, scheduled, tokens, strict=True):
                view.num_computed_tokens += n
                view.output_token_ids.append(token)
                proposals[i].append(token)
        for i, _view, _k in rows:
            state = items[i][0]
            seq = self.sequences[state.request_id]
            seq.num_known = state.num_tokens
            seq.drafts = proposals[i]
        return proposals

    # ------------------------------------------------------------------ inside

    def _draft_view(self, state: RequestState, k: int) -> RequestState | None:
        """The request as the draft sees it: its known tokens, its draft blocks, and how many of its
        leading tokens already have draft K/V. None: no room (pool or context) for k proposals."""
        known = state.num_tokens
        if known + k > self.max_model_len:
            return None
        seq = self.sequences.get(state.request_id)
        if seq is None:
            seq = self.sequences[state.request_id] = DraftSequence()
        # Valid K/V: the tokens known last time, and the proposals the target has accepted since.
        valid = min(seq.num_known, known)
        newer = state.tokens(valid, known) if valid == seq.num_known else []
        for drafted, token in zip(seq.drafts[:-1], newer, strict=False):  # the last draft has no K/V
            if drafted != token:
                break
            valid += 1
        valid = min(valid, known - 1)  # the last known token is fed again: its row gives proposal 1
        need = blocks_for(known + k - 1, self.block_size) - len(seq.block_ids)
        if need > len(self.free_blocks):
            seq.num_known, seq.drafts = valid, []  # what stays valid for a later try
            return None
        seq.block_ids += [self.free_blocks.pop() for _ in range(need)]
        return RequestState(
            request_id=state.request_id,
            prompt_token_ids=state.prompt_token_ids,  # never modified: shared
            output_token_ids=list(state.output_token_ids),  # the draft appends its proposals here
            num_computed_tokens=valid,
            block_ids=seq.block_ids,
            sampling=state.sampling,
            num_tokens_at_start=state.num_tokens_at_start,
        )

    def _argmax(self, scheduled: list[tuple[RequestState, int]]) -> list[int]:
        batch = pack_batch(scheduled, self.block_size, self.device)
        long_tokens = None
        if (long_from := self.model.rotary.long_from) is not None:
            starts = [view.num_tokens_at_start for view, _ in scheduled]
            long_tokens = longrope_tokens(batch.positions, starts, [n for _, n in scheduled], long_from)
        hidden = self.model(batch.input_ids, batch.positions, self.kv_cache.layers(), batch.meta, long_tokens)
        logits = self.model.compute_logits(hidden[batch.logits_indices])
        return logits[:, : self.vocab_size].argmax(dim=-1).tolist()


def check_same_vocabulary(
    model_path: str, vocab_size: int, tokenizer_path: Path | None, target: TargetFacts
) -> None:
    """The draft's token ids must mean the target's tokens: the same embedding size, and where both
    checkpoints carry a tokenizer, the same vocabulary (token -> id)."""
    if vocab_size != target.vocab_size:
        raise DraftVocabularyMismatch(
            f"speculative_config.model {model_path!r}: its vocabulary has {vocab_size} tokens, the "
            f"target's {target.vocab_size}; a draft model must share the target's tokenizer"
        )
    ours, theirs = load_tokenizer(tokenizer_path), load_tokenizer(target.tokenizer_path)
    if ours is None or theirs is None:
        return
    mine, target_vocab = ours.get_vocab(), theirs.get_vocab()
    if mine != target_vocab:
        differ = sorted(set(mine.items()) ^ set(target_vocab.items()), key=lambda kv: kv[1])[:3]
        raise DraftVocabularyMismatch(
            f"speculative_config.model {model_path!r}: its tokenizer's vocabulary differs from the "
            f"target's ({len(mine)} vs {len(target_vocab)} tokens; first differences {differ}); a draft "
            "model must share the target's tokenizer"
        )
