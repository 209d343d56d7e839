"""Prompt logprobs from the prefill the worker runs anyway (sampling.prompt_logprobs = top-n per position).

The forward pass gives a hidden state for every token it computes; only the last one of a request is
turned into logits to sample. For a request that asked for prompt logprobs, the rows of its prompt
positions are turned into logits too, chunk by chunk (chunked prefill), kept per request, and sent
once with its first sampled token. Rows are taken a slice at a time so a long prompt never holds
[prompt, vocab] logits at once.

The scheduler makes such a request compute its whole prompt (no prefix-cache hits): a position whose
K/V came from the cache was never run here, and there is no hidden state to read its logprob from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pagedserve.services.worker.packed_batch import RequestState
from pagedserve.shared.protocol.prompt_logprobs import PackedPromptLogprobs

ROWS_PER_SLICE = 256  # logits of at most this many positions at once (256 x 49,152 x 4 B = 50 MB)


@dataclass(slots=True)
class PromptTally:
    """One request's prompt logprobs so far: positions 0 .. next_position-1 (each predicts the next token)."""

    num_top: int
    next_position: int = 0
    values: list[torch.Tensor] = field(default_factory=list)  # [m] float32, per chunk
    top_ids: list[torch.Tensor] = field(default_factory=list)  # [m, k] int32
    top_values: list[torch.Tensor] = field(default_factory=list)  # [m, k] float32

    def packed(self, request_id: str) -> PackedPromptLogprobs:
        def raw(parts: list[torch.Tensor], dtype: torch.dtype) -> bytes:
            if not parts:
                return b""
            return torch.cat(parts).to(dtype).contiguous().numpy().astype(_LITTLE[dtype]).tobytes()

        return PackedPromptLogprobs(
            request_id,
            self.num_top,
            raw(self.values, torch.float32),
            raw(self.top_ids, torch.int32),
            raw(self.top_values, torch.float32),
        )


_LITTLE = {torch.float32: "<f4", torch.int32: "<i4"}


def wanted(state: RequestState) -> PromptTally | None:
    """A tally for a request that asked and has prompt positions left to compute, else None."""
    k = state.sampling.prompt_logprobs
    if k is None or state.output_token_ids:
        return None  # not asked, or asked and already delivered (a recompute has outputs)
    return PromptTally(int(k))


def collect(
    tallies: dict[str, PromptTally],
    scheduled: list[tuple[RequestState, int]],
    hidden: torch.Tensor,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Add this step's prompt positions of every tallied request (before num_computed advances)."""
    offset = 0
    for state, n in scheduled:
        tally = tallies.get(state.request_id)
        start = state.num_computed_tokens
        if tally is not None:
            if start != tally.next_position:
                raise ValueError(
                    f"request {state.request_id!r} wants prompt logprobs, but this step computes from "
                    f"position {start}, not {tally.next_position}: its prompt must be computed whole"
                )
            # Position p predicts prompt[p + 1]: the last prompt position predicts the first output.
            end = min(start + n, len(state.prompt_token_ids) - 1)
            if end > start:
                targets = torch.tensor(state.prompt_token_ids[start + 1 : end + 1], device=hidden.device)
                _add(tally, hidden[offset : offset + end - start], targets, compute_logits)
            tally.next_position = start + n
        offset += n


def _add(
    tally: PromptTally,
    rows: torch.Tensor,
    targets: torch.Tensor,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    for lo in range(0, rows.shape[0], ROWS_PER_SLICE):
        hi = lo + ROWS_PER_SLICE
        logprobs = compute_logits(rows[lo:hi]).to(torch.float32).log_softmax(dim=-1)
        tally.values.append(logprobs.gather(1, targets[lo:hi].unsqueeze(1)).squeeze(1).cpu())
        if tally.num_top:
            values, ids = logprobs.topk(tally.num_top, dim=-1)
            tally.top_ids.append(ids.to(torch.int32).cpu())
            tally.top_values.append(values.cpu())


def take_finished(tallies: dict[str, PromptTally], sampled: list[RequestState]) -> list[PackedPromptLogprobs]:
    """The tallies of requests that sampled their first token in this step: sent now, then dropped."""
    return [tallies.pop(s.request_id).packed(s.request_id) for s in sampled if s.request_id in tallies]
