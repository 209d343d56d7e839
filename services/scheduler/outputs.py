"""Output processing: sampled tokens -> text, stop conditions, logprobs, and the client's events.

Each completion has a CompletionText (incremental detokenization, stop strings held back) and its
logprobs so far. Events say what the client should see now; RequestDone says a whole client
request (all n completions) has ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pagedserve.services.scheduler.limits import SchedulerStats
from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.stopping import stop_reason
from pagedserve.shared.completion_text import CompletionText, Tokenizer, text_decoder
from pagedserve.shared.protocol.frontend import CompletionOutput
from pagedserve.shared.protocol.prompt_logprobs import PromptLogprobs


@dataclass(slots=True)
class OutputEvent:
    """What the client should see: new tokens of one completion, and/or its end."""

    request_id: str  # the id the client submitted
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[Any] | None = None
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # with the first token, when asked for


@dataclass(slots=True)
class RequestDone:
    """Every completion of a client request has ended."""

    request_id: str
    completions: list[Request]
    texts: list[str]
    logprobs: list[list[Any] | None]
    num_prompt_tokens: int
    num_cached_tokens: int
    error_code: str | None = None
    error_message: str | None = None  # the numbers behind error_code, when there are any

    @property
    def prompt_logprobs(self) -> PromptLogprobs | None:
        return self.completions[0].prompt_logprobs

    @property
    def pooled(self) -> bytes | None:
        return self.completions[0].pooled

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(r.output_token_ids) for r in self.completions)

    def completion_outputs(self, unfinished_reason: str) -> list[CompletionOutput]:
        """The completions as the client reads them; one that never got a reason gets `unfinished_reason`."""
        return [
            CompletionOutput(
                index=r.index,
                token_ids=list(r.output_token_ids),
                text=text,
                finish_reason=r.finish_reason or unfinished_reason,
                logprobs=lps,
            )
            for r, text, lps in zip(self.completions, self.texts, self.logprobs, strict=True)
        ]


class Outputs:
    def __init__(
        self,
        tokenizer: Tokenizer | None,
        eos_token_ids: Sequence[int],
        max_model_len: int,
        stats: SchedulerStats,
    ) -> None:
        self.decode = text_decoder(tokenizer)
        self.eos_token_ids = list(eos_token_ids)
        self.max_model_len = max_model_len
        self.stats = stats
        self.texts: dict[str, CompletionText] = {}
        self.logprobs: dict[str, list[Any]] = {}

    def open(self, req: Request) -> None:
        if not req.detokenize:  # its client makes the text: nothing to decode, no stop string here
            self.texts[req.request_id] = CompletionText(None)
            return
        self.texts[req.request_id] = CompletionText(
            self.decode, list(req.sampling.stop), req.sampling.include_stop_str_in_output
        )

    def trim(self, req: Request, num_tokens: int) -> None:
        """Keep the first `num_tokens` outputs (and their logprobs): a client's stop string ends there."""
        del req.output_token_ids[num_tokens:]
        logprobs = self.logprobs.get(req.request_id)
        if logprobs is not None:
            del logprobs[num_tokens:]

    def accept(self, req: Request, token: int, logprob: Any, now: float) -> str | None:
        """Take one sampled token; the reason the completion ends with it, or None."""
        req.output_token_ids.append(token)
        self.stats.generated_tokens += 1
        if req.first_token_at is None:
            req.first_token_at = now
        req.last_token_at = now
        if logprob is not None:
            self.logprobs.setdefault(req.request_id, []).append(logprob)
        reason = stop_reason(
            req.sampling,
            token,
            len(req.output_token_ids),
            req.num_known,
            self.eos_token_ids,
            self.max_model_len,
        )
        if self.texts[req.request_id].add(req.output_token_ids) and reason is None:
            reason = "stop"
        return reason

    def delta(self, req: Request, tokens: list[int], logprobs: list[Any]) -> OutputEvent:
        """The tokens one step added (several when proposals were accepted) and their text."""
        text = self.texts[req.request_id].take_delta(False, req.output_token_ids)
        lps = None if all(lp is None for lp in logprobs) else logprobs
        return OutputEvent(req.parent_id or req.request_id, req.index, tokens, text, lps)

    def final(
        self, req: Request, reason: str, new_tokens: list[int] | None, new_logprobs: list[Any] | None
    ) -> OutputEvent:
        """The completion's last event: whatever text is kept and not yet sent, and why it ended."""
        text = self.texts[req.request_id].take_delta(True, req.output_token_ids)
        lps = None if new_logprobs is None or all(lp is None for lp in new_logprobs) else new_logprobs
        return OutputEvent(req.parent_id or req.request_id, req.index, new_tokens or [], text, lps, reason)

    def emitted_text(self, request_id: str) -> str:
        """The text a client has been sent so far (a reconnect replays it)."""
        text = self.texts[request_id]
        return text.text[: text.emitted]

    def done(
        self,
        group_id: str,
        completions: list[Request],
        error_code: str | None,
        error_message: str | None = None,
    ) -> RequestDone:
        parent = completions[0]
        texts = [self.texts.pop(r.request_id).text if r.request_id in self.texts else "" for r in completions]
        logprobs = [self.logprobs.pop(r.request_id, None) for r in completions]
        return RequestDone(
            group_id,
            completions,
            texts,
            logprobs,
            len(parent.prompt_token_ids),
            parent.num_cached_tokens,
            error_code,
            error_message,
        )
