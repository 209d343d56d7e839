"""Why a completion ends with a token: EOS, a stop token id, max_tokens or the context's end.
(Stop strings need its text: shared/completion_text.py.)"""

from __future__ import annotations

from collections.abc import Sequence

from pagedserve.shared.protocol.frontend import SamplingParams


def stop_reason(
    sampling: SamplingParams,
    token: int,
    num_output: int,
    num_total: int,
    eos_token_ids: Sequence[int],
    max_model_len: int,
) -> str | None:
    """Why the completion ends after `token` (its num_output-th token), or None."""
    if num_output >= sampling.min_tokens:
        if not sampling.ignore_eos and token in eos_token_ids:
            return "stop"
        if token in sampling.stop_token_ids:
            return "stop"
    if num_output >= sampling.max_tokens or num_total >= max_model_len:
        return "length"
    return None
