"""Truncating a distribution before sampling: top-k, top-p (nucleus) and min-p, per row, batched.

Each rule is turned into a per-row *floor*: the lowest temperature-scaled logit the row keeps. The
sampler drops every token below the highest floor. Tokens tied with a floor are kept (they are
exactly as good as the last token in), so with ties a row may keep more than top_k tokens.

Sorting a 49k vocabulary is slow on the CPU (~4 ms a row), so top-k / top-p look at the best few
hundred tokens first (torch.topk) and only sort more of a row whose nucleus does not end there.

This is the torch path (any device; the oracle in the tests). On the CPU the sampler's C++ op
(kernels/cpu/sampling.cpp) applies the same rules in a pass or two over each row.
"""

from __future__ import annotations

import math

import torch

# Candidates tried in turn for rows whose nucleus is still open; the last resort is the whole vocab.
CANDIDATE_SIZES = (256, 4096)


def top_k_top_p_floor(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per-row floor [rows] for keeping the `top_k` best tokens (0 = all), then the nucleus: the
    fewest best tokens whose probability, renormalised after top-k, sums to at least `top_p`.
    Rows with neither rule get -inf. top_k [rows] int, top_p [rows] float."""
    num_rows, vocab_size = logits.shape
    floor = torch.full((num_rows,), -math.inf, device=logits.device, dtype=logits.dtype)
    active = (top_k > 0) | (top_p < 1.0)
    pending = active.nonzero().squeeze(1)
    for size in (*CANDIDATE_SIZES, vocab_size):
        if pending.numel() == 0:
            break
        every_row = pending.numel() == num_rows  # then skip the gather: a copy of every logit
        rows = logits if every_row else logits[pending]
        row_floor, resolved = _floor_from_best(rows, top_k[pending], top_p[pending], size)
        floor[pending[resolved]] = row_floor[resolved]
        pending = pending[~resolved]
    return floor


def _floor_from_best(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The floor from each row's best `size` tokens (at least its top_k), and whether those decide it."""
    vocab_size = logits.shape[1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab_size), vocab_size)
    all_top_k = bool((top_k > 0).all())
    # When every row has a top-k, its k best decide everything; else look at `size` (or more) first.
    num_best = min(vocab_size, int(top_k.max()) if all_top_k else max(size, int(top_k.max())))
    best = logits.topk(num_best, dim=1).values  # sorted, best first
    in_top_k = torch.arange(num_best, device=logits.device).unsqueeze(0) < k.unsqueeze(1)

    # Top-p renormalises over the top-k set when there is one, else over the whole row.
    normaliser = best.masked_fill(~in_top_k, -math.inf).logsumexp(dim=1)
    if not all_top_k:
        normaliser = torch.where(top_k > 0, normaliser, logits.logsumexp(dim=1))
    probs = (best - normaliser.unsqueeze(1)).exp_().masked_fill_(~in_top_k, 0.0)
    mass_before = probs.cumsum(dim=1) - probs
    # A token stays while the better tokens' mass is still short of top_p (so the best always stays).
    # top_p == 1 is exempt: a cumulative sum that rounds up to 1.0 must not cut the tail.
    in_nucleus = (mass_before < top_p.unsqueeze(1)) | (top_p >= 1.0).unsqueeze(1)
    num_kept = (in_top_k & in_nucleus).sum(dim=1)
    floor = best.gather(1, (num_kept - 1).unsqueeze(1)).squeeze(1)
    # Decided if the kept set ends before the candidates do, or top-k bounds it, or nothing is left out.
    resolved = (num_kept < num_best) | (top_k > 0) | (num_best == vocab_size)
    return floor, resolved


def min_p_floor(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Per-row floor [rows] dropping tokens whose probability is below `min_p` times the row's best.

    p_i < min_p * p_max  <=>  logit_i < logit_max + log(min_p), so no softmax is needed; min_p = 0
    gives -inf and drops nothing.
    """
    log_min_p = torch.where(min_p > 0, min_p.clamp_min(1e-30).log(), -math.inf)
    return logits.amax(dim=1) + log_min_p
