"""Pooling requests (sampling.pooling): the prompt's final hidden states -> one vector, no sampling.

`last` and `token_ids` read only the row of the prompt's last position, in the step that computes
it. `mean` and `cls` read every position: their rows are folded into a per-request tally chunk by
chunk (chunked prefill), so a long prompt never holds more than one chunk of hidden states. The
scheduler makes such a request compute its whole prompt (no prefix-cache hits), as for prompt
logprobs: a position whose K/V came from the cache has no hidden state here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedserve.services.worker.packed_batch import RequestState
from pagedserve.shared.protocol.pooling import PooledOutput, PoolingSpec


@dataclass(slots=True)
class PoolTally:
    """A mean/cls request's prompt so far: the sum of its rows and its first row (float32)."""

    total: torch.Tensor | None = None
    first: torch.Tensor | None = None
    count: int = 0


def wanted(state: RequestState) -> PoolTally | None:
    spec = state.sampling.pooling
    if spec is None or spec.token_ids is not None or spec.pooling == "last":
        return None
    return PoolTally()


def collect(
    tallies: dict[str, PoolTally], scheduled: list[tuple[RequestState, int]], hidden: torch.Tensor
) -> None:
    """Fold this step's rows of every tallied request in (before num_computed advances)."""
    offset = 0
    for state, n in scheduled:
        tally = tallies.get(state.request_id)
        if tally is not None:
            if state.num_computed_tokens != tally.count:
                raise ValueError(
                    f"request {state.request_id!r} pools {getattr(state.sampling.pooling, 'pooling', None)!r} "
                    f"over its whole prompt, but this step computes from position "
                    f"{state.num_computed_tokens}, not {tally.count}: its prompt must be computed whole"
                )
            rows = hidden[offset : offset + n].to(torch.float32)
            if tally.first is None:
                tally.first = rows[0].clone()
            part = rows.sum(dim=0)
            tally.total = part if tally.total is None else tally.total + part
            tally.count += n
        offset += n


def pooled_outputs(
    states: list[RequestState],
    last_rows: torch.Tensor,
    tallies: dict[str, PoolTally],
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
) -> list[PooledOutput]:
    """The vectors of the requests whose prompt ended in this step; `last_rows[i]` is the final
    hidden state of `states[i]`'s last prompt position. Their tallies are dropped."""
    outputs = []
    for i, state in enumerate(states):
        spec = state.sampling.pooling
        assert spec is not None
        tally = tallies.pop(state.request_id, None)
        if spec.token_ids is not None:
            logits = compute_logits(last_rows[i : i + 1])[0].to(torch.float32)
            vector = logits[torch.tensor(spec.token_ids, device=logits.device)]
        else:
            vector = _pooled(spec, last_rows[i], tally)
        outputs.append(PooledOutput(state.request_id, _bytes(vector)))
    return outputs


def _pooled(spec: PoolingSpec, last: torch.Tensor, tally: PoolTally | None) -> torch.Tensor:
    if spec.pooling == "last":
        vector = last.to(torch.float32)
    else:
        assert tally is not None and tally.total is not None and tally.first is not None
        vector = tally.first if spec.pooling == "cls" else tally.total / tally.count
    if spec.dimensions is not None:
        vector = vector[: spec.dimensions]  # Matryoshka: the leading values, normalised after the cut
    if spec.normalize:
        vector = torch.nn.functional.normalize(vector, p=2.0, dim=0)
    return vector


def _bytes(vector: torch.Tensor) -> bytes:
    # numpy's '<f4' is little-endian whatever the machine's order (the wire's order).
    return vector.detach().to(torch.float32).cpu().contiguous().numpy().astype("<f4").tobytes()
