"""Logit penalties over the tokens a request has seen, and the min_tokens mask. In place, batched.

- repetition_penalty (Hugging Face / CTRL): every token seen in the prompt or the output has its
  logit divided by the penalty when positive and multiplied by it when negative;
- presence_penalty (OpenAI): subtracted once from every token that appears in the output;
- frequency_penalty (OpenAI): subtracted once per occurrence in the output.
Repetition is applied first, then presence and frequency on its result.

Only seen tokens change, so the work is gather -> change -> scatter over the seen ids ([rows, seen]),
never a pass over [rows, vocab]: with long outputs and a 49k vocabulary that is ~100x less memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _padded_ids(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (ids [rows, width], real [rows, width] bool). A row is padded with copies of its own first
    id, so a scatter of a per-id value writes the same value twice; an empty row is padded with 0
    and its slots are not real (callers must leave them unchanged)."""
    width = max(1, max((len(r) for r in rows), default=0))
    data = [list(r) + [r[0] if len(r) else 0] * (width - len(r)) for r in rows]
    lengths = torch.tensor([len(r) for r in rows], device=device)
    ids = torch.tensor(data, dtype=torch.long, device=device).reshape(len(rows), width)
    real = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    return ids, real


def _per_row(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, device=like.device, dtype=like.dtype).unsqueeze(1)


def apply_penalties(
    logits: torch.Tensor,
    prompt_ids: Sequence[Sequence[int]],
    output_ids: Sequence[Sequence[int]],
    repetition: Sequence[float],
    presence: Sequence[float],
    frequency: Sequence[float],
) -> torch.Tensor:
    """Penalise `logits` [rows, vocab] in place (one entry per row in every other argument); returns it."""
    seen, seen_real = _padded_ids(
        [[*p, *o] for p, o in zip(prompt_ids, output_ids, strict=True)], logits.device
    )
    # A row with no tokens at all is all padding; the padding copies of a real id get the same value.
    seen_any = seen_real[:, :1]
    before = logits.gather(1, seen)
    rep = _per_row(repetition, logits)
    after = torch.where(before > 0, before / rep, before * rep)
    logits.scatter_(1, seen, torch.where(seen_any, after, before))

    out, out_real = _padded_ids(output_ids, logits.device)
    before = logits.gather(1, out)
    logits.scatter_(1, out, torch.where(out_real[:, :1], before - _per_row(presence, logits), before))
    # scatter_add counts every occurrence; padding slots add 0.
    logits.scatter_add_(1, out, -_per_row(frequency, logits) * out_real.to(logits.dtype))
    return logits


def mask_tokens(logits: torch.Tensor, banned: Sequence[tuple[int, Sequence[int]]]) -> torch.Tensor:
    """Set the logits of (row, token ids) pairs to -inf in place: those tokens cannot be sampled."""
    rows = [row for row, tokens in banned for _ in tokens]
    cols = [t for _, tokens in banned for t in tokens]
    if rows:
        index = torch.tensor([rows, cols], dtype=torch.long, device=logits.device)
        logits[index[0], index[1]] = float("-inf")
    return logits
