"""What the worker remembers per request between steps, and the packed batch of one step.

Hot path: run once per step over every scheduled request. Bookkeeping is plain Python lists; the
tensors are built once at the end, one per field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pagedserve.kernels.attention import AttentionMetadata
from pagedserve.shared.paging import blocks_for
from pagedserve.shared.protocol.step import WorkerSampling


@dataclass(slots=True)
class RequestState:
    request_id: str
    # Prompt and outputs apart, so the sampler gets both every step without copying either.
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # every token sampled so far; the last may not be computed yet
    num_computed_tokens: int  # leading tokens whose K/V is in the cache
    block_ids: list[int]  # the block table
    sampling: WorkerSampling
    # The grammar matcher of a constrained request (services/constraints), built at its first sampled
    # token by replaying output_token_ids; None for an unconstrained one (or before that token).
    matcher: Any = None
    marker_scanned: int = 0  # a constraint's starts_after: outputs before this end were searched
    # The proposer's index over this request's tokens (proposers/ngram.py), built at its first proposal.
    proposal_index: Any = None
    lora_name: str | None = None  # the request's LoRA adapter (None: the base model)
    lora_path: str | None = None
    # Tokens known when the worker (re)started it (prompt, plus outputs on a recompute): LongRoPE
    # rotates all of a request's tokens with its long factors once this passes the original length.
    num_tokens_at_start: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def tokens(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] of prompt + outputs."""
        prompt = self.prompt_token_ids
        split = len(prompt)
        if end <= split:
            return prompt[start:end]
        if start >= split:
            return self.output_token_ids[start - split : end - split]
        return prompt[start:] + self.output_token_ids[: end - split]


@dataclass(slots=True)
class PackedBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    sample_rows: list[int]  # indices into the scheduled list of the requests that sample this step
    # Their rows in the packed batch whose logits are read: the last token of each, or for a decode
    # with proposed tokens its input and each proposal (1 + p rows, in order).
    logits_indices: torch.Tensor
    # Pooling requests (sampling.pooling) that reach their prompt's end: pooled, never sampled.
    pool_rows: list[int]  # indices into the scheduled list
    pool_indices: list[int]  # their last token in the packed batch


def pack_batch(
    scheduled: list[tuple[RequestState, int]],
    block_size: int,
    device: torch.device,
    proposed: dict[int, list[int]] | None = None,
) -> PackedBatch:
    """One flat batch from (request, tokens to compute now) pairs, in the given order.

    Request r's inputs are token_ids[num_computed : num_computed + n]: for a decode that is the
    token the worker itself sampled last step, which the scheduler never had to send. `proposed`
    (scheduled index -> tokens): a decode extended by proposed tokens, scored at the next positions.
    """
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start_loc = [0]
    query_lens: list[int] = []
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    sample_rows: list[int] = []
    logits_indices: list[int] = []
    pool_rows: list[int] = []
    pool_indices: list[int] = []
    for row, (state, n) in enumerate(scheduled):
        start = state.num_computed_tokens
        end = start + n
        known = state.num_tokens
        extra = proposed.get(row) if proposed else None
        if end > known:
            raise ValueError(
                f"request {state.request_id!r}: {n} tokens scheduled from {start}, but the worker knows "
                f"only {known} tokens (was its previous step's token never sampled?)"
            )
        blocks = state.block_ids
        num_blocks = blocks_for(end, block_size)
        if num_blocks > len(blocks):
            raise ValueError(
                f"request {state.request_id!r}: {end} tokens need {num_blocks} blocks of {block_size}, "
                f"its block table has {len(blocks)}"
            )
        input_ids += state.tokens(start, end)
        if extra:
            if end != known:
                raise ValueError(
                    f"request {state.request_id!r}: tokens proposed for a step that samples none"
                )
            input_ids += extra
            end += len(extra)
            n += len(extra)
            num_blocks = blocks_for(end, block_size)
            if num_blocks > len(blocks):
                raise ValueError(
                    f"request {state.request_id!r}: {len(extra)} proposed tokens reach position {end}, "
                    f"past its block table of {len(blocks)} blocks of {block_size}"
                )
        positions += range(start, end)
        if n == 1:
            slots.append(blocks[start // block_size] * block_size + start % block_size)
        else:
            slots += [blocks[p // block_size] * block_size + p % block_size for p in range(start, end)]
        query_start_loc.append(query_start_loc[-1] + n)
        query_lens.append(n)
        seq_lens.append(end)
        tables.append(blocks[:num_blocks])
        if end == known + (len(extra) if extra else 0):
            if state.sampling.pooling is not None:  # never speculates: it has no decode
                pool_rows.append(row)
                pool_indices.append(query_start_loc[-1] - 1)
            else:
                sample_rows.append(row)
                if extra:
                    logits_indices += range(query_start_loc[-1] - 1 - len(extra), query_start_loc[-1])
                else:
                    logits_indices.append(query_start_loc[-1] - 1)

    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) if len(t) < width else t for t in tables]
    meta = AttentionMetadata(
        slot_mapping=_tensor(slots, torch.int64, device),
        query_start_loc=_tensor(query_start_loc, torch.int32, device),
        seq_lens=_tensor(seq_lens, torch.int32, device),
        block_tables=_tensor(padded, torch.int32, device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )
    return PackedBatch(
        input_ids=_tensor(input_ids, torch.int64, device),
        positions=_tensor(positions, torch.int64, device),
        meta=meta,
        sample_rows=sample_rows,
        logits_indices=_tensor(logits_indices, torch.int64, device),
        pool_rows=pool_rows,
        pool_indices=pool_indices,
    )


def _tensor(values: list[Any], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)
