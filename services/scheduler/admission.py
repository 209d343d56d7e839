"""Checks a request must pass before it is queued. One clear error naming the field and the limit."""

from __future__ import annotations

from collections.abc import Sequence

from pagedserve.shared.protocol.frontend import SamplingParams


class RequestRejected(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_request(
    prompt_token_ids: Sequence[int],
    sampling: SamplingParams,
    max_model_len: int,
    vocab_size: int,
    can_stop_on_strings: bool = True,
) -> None:
    if not prompt_token_ids:
        raise RequestRejected("invalid_request", "prompt is empty: at least one token is needed")
    if sampling.pooling is not None:
        check_pooling(prompt_token_ids, sampling, max_model_len, vocab_size)
    elif len(prompt_token_ids) >= max_model_len:
        raise RequestRejected(
            "prompt_too_long",
            f"prompt has {len(prompt_token_ids)} tokens; the model's context (max_model_len) is "
            f"{max_model_len}, leaving room for at least one generated token",
        )
    elif len(prompt_token_ids) + sampling.max_tokens > max_model_len:
        raise RequestRejected(
            "max_tokens_too_large",
            f"max_tokens={sampling.max_tokens} with a prompt of {len(prompt_token_ids)} tokens exceeds "
            f"max_model_len={max_model_len}; at most {max_model_len - len(prompt_token_ids)} fit",
        )
    bad = next((t for t in prompt_token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestRejected(
            "token_out_of_vocab", f"prompt_token_ids holds {bad}, outside the vocabulary [0, {vocab_size})"
        )
    bad = next((t for t in sampling.stop_token_ids if t >= vocab_size), None)
    if bad is not None:
        raise RequestRejected(
            "token_out_of_vocab",
            f"sampling.stop_token_ids holds {bad}, outside the vocabulary [0, {vocab_size})",
        )
    if sampling.stop and not can_stop_on_strings:
        raise RequestRejected("invalid_request", "sampling.stop needs a tokenizer; this model has none")
    bad = next((t for t in sampling.logit_bias or () if t >= vocab_size), None)
    if bad is not None:
        raise RequestRejected(
            "invalid_logit_bias",
            f"sampling.logit_bias names token {bad}, outside the vocabulary [0, {vocab_size})",
        )
    if sampling.structured_outputs is not None:
        bad = next((t for t in sampling.structured_outputs.starts_after or () if t >= vocab_size), None)
        if bad is not None:
            raise RequestRejected(
                "invalid_constraint",
                f"sampling.structured_outputs.starts_after holds {bad}, outside the vocabulary [0, {vocab_size})",
            )
        check_structured_outputs(sampling, can_stop_on_strings)


def check_pooling(
    prompt_token_ids: Sequence[int], sampling: SamplingParams, max_model_len: int, vocab_size: int
) -> None:
    """A pooling request generates nothing: its prompt may fill the context, max_tokens is not read."""
    if len(prompt_token_ids) > max_model_len:
        raise RequestRejected(
            "prompt_too_long",
            f"prompt has {len(prompt_token_ids)} tokens; the model's context (max_model_len) is {max_model_len}",
        )
    assert sampling.pooling is not None
    bad = next((t for t in sampling.pooling.token_ids or () if t >= vocab_size), None)
    if bad is not None:
        raise RequestRejected(
            "token_out_of_vocab",
            f"sampling.pooling.token_ids holds {bad}, outside the vocabulary [0, {vocab_size})",
        )


def check_structured_outputs(sampling: SamplingParams, has_tokenizer: bool) -> None:
    """Before anything is queued: the constraint parses (schema, regex, grammar), else one error
    naming its field. Compiling it against the vocabulary is left to the worker that runs it."""
    if not has_tokenizer:
        raise RequestRejected(
            "invalid_constraint", "sampling.structured_outputs needs a tokenizer; this model has none"
        )
    from pagedserve.services.constraints.grammar import ConstraintError, check_constraint  # lazily: xgrammar

    try:
        check_constraint(sampling.structured_outputs)
    except ConstraintError as exc:
        raise RequestRejected("invalid_constraint", f"sampling.{exc.field}: {exc.message}") from None
