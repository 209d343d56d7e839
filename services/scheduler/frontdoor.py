"""The scheduler's front door: client frames in, replies out.

A raw frame becomes a validated Submit / Abort / Ping, or one clear Error naming the field and the
limit (and nothing changes: the service goes on serving). The core's events become Delta,
Finished and Error replies, routed by the per-client book; a reconnecting client gets a replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import zmq
from pydantic import ValidationError

from pagedserve.services.scheduler.admission import RequestRejected, check_request
from pagedserve.services.scheduler.clients import ClientBook, FinishedStore
from pagedserve.services.scheduler.metrics import SchedulerMetrics
from pagedserve.services.scheduler.model_info import ModelInfo
from pagedserve.services.scheduler.outputs import OutputEvent, RequestDone
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.protocol.codec import ProtocolError
from pagedserve.shared.protocol.frontend import (
    CLIENT_MESSAGES,
    Abort,
    Accepted,
    Delta,
    Error,
    Finished,
    Locate,
    Location,
    Ping,
    Pong,
    StopAt,
    Submit,
    Usage,
)
from pagedserve.shared.protocol.messages import read_message
from pagedserve.shared.transport import Route, send

_ERROR_MESSAGES = {
    "no_workers": "no live worker could serve the request before its timeout",
    "timeout": "the request did not finish before its timeout",
    "too_large_for_pool": "the request needs more KV blocks than a worker's whole pool",
}


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "(message)"
        ctx = err.get("ctx") or {}
        limit = ", ".join(f"{k}={v}" for k, v in ctx.items() if k != "error")
        parts.append(f"{loc}: {err['msg']}" + (f" ({limit})" if limit else ""))
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_client_message(msg: dict[str, Any]) -> Submit | Abort | Ping | StopAt | Locate:
    """Validate a decoded frame against the client message types; raises RequestRejected."""
    try:
        return read_message(msg, CLIENT_MESSAGES)
    except ProtocolError as exc:
        raise RequestRejected(exc.code, f"type: {exc.message}") from None
    except ValidationError as exc:
        raise RequestRejected("invalid_request", describe_validation_error(exc)) from None


def tokenize_submit(submit: Submit, tokenizer: Any, max_model_len: int, vocab_size: int) -> list[int]:
    if submit.prompt_token_ids is not None:
        tokens = list(submit.prompt_token_ids)
    else:
        if tokenizer is None:
            raise RequestRejected(
                "invalid_request", "prompt: this model has no tokenizer; send prompt_token_ids"
            )
        tokens = tokenizer.encode(submit.prompt)
    check_request(tokens, submit.sampling, max_model_len, vocab_size, tokenizer is not None)
    return tokens


class FrontDoor:
    """The client side of the scheduler service: the front ROUTER socket and everything said on it."""

    def __init__(
        self,
        sock: zmq.Socket,
        core: Scheduler,
        model: ModelInfo,
        clients: ClientBook,
        request_timeout_s: float,
        metrics: SchedulerMetrics,
        log: Any,
        max_waiting_requests: int | None = None,
        finished: FinishedStore | None = None,
        served_len: Callable[[], int] | None = None,
    ) -> None:
        self.sock = sock
        # The context a request is checked against: the checkpoint's, or less if the workers say so.
        self.served_len = served_len or (lambda: model.max_model_len)
        self.max_waiting_requests = max_waiting_requests
        self.core = core
        self.model = model
        self.clients = clients
        self.request_timeout_s = request_timeout_s
        self.metrics = metrics
        self.log = log
        self.finished = finished if finished is not None else FinishedStore()
        self.streams: dict[tuple[str, int], list[int]] = {}  # (request, index) -> [tokens sent, chars sent]

    def on_message(self, client: Route, msg: dict[str, Any], now: float) -> None:
        self.clients.seen(client, now)
        rid = msg.get("request_id") if isinstance(msg.get("request_id"), str) else None
        try:
            parsed = parse_client_message(msg)
            if isinstance(parsed, Ping):
                send(self.sock, Pong(), to=client)
            elif isinstance(parsed, StopAt):
                self.dispatch(self.core.stop_at(parsed.request_id, parsed.index, parsed.num_tokens), now)
            elif isinstance(parsed, Locate):
                send(
                    self.sock,
                    Location(request_id=parsed.request_id, state=self.locate(parsed.request_id)),
                    to=client,
                )
            elif isinstance(parsed, Abort):
                self.abort(parsed.request_id, now)
            else:
                self.submit(parsed, client, now)
        except RequestRejected as exc:
            self.metrics.rejected.labels(exc.code).inc()
            self.log.warning("request_rejected", request_id=rid, code=exc.code, error=exc.message)
            send(self.sock, Error(code=exc.code, message=exc.message, request_id=rid), to=client)

    def submit(self, submit: Submit, client: Route, now: float) -> None:
        rid = submit.request_id
        stored = self.finished.get(rid)
        if stored is not None:  # a retry of something already done: answer, do not run it again
            send(self.sock, stored, to=client)
            return
        if self.core.is_live(rid):
            if not submit.attach:
                raise RequestRejected(
                    "duplicate_request_id",
                    f"request_id: {rid!r} is already live; use a new id, or attach=True to reconnect",
                )
            self.clients.reroute(client, rid, submit.stream)
            self._replay(rid, client)
            return
        limit = self.max_waiting_requests
        if limit is not None and self.core.num_waiting >= limit:
            # Refused at once, before any work: a queue that grows without end only turns a burst
            # into timeouts for everyone. Retries and re-attaches above are never refused.
            raise RequestRejected(
                "overloaded",
                f"max_waiting_requests: {self.core.num_waiting} requests already wait (limit {limit}); retry later",
            )
        lora = None
        if submit.lora is not None:
            lora = self.core.loras.get(submit.lora)
            if lora is None:
                served = ", ".join(self.core.loras.names()) or "none"
                raise RequestRejected(
                    "unknown_lora",
                    f"model {submit.lora!r} is neither the base model nor a loaded LoRA adapter (adapters: {served})",
                )
        tokens = tokenize_submit(submit, self.model.tokenizer, self.served_len(), self.model.vocab_size)
        self.clients.admit(client, rid, submit.stream, submit.user)
        timeout = submit.timeout_s or self.request_timeout_s
        # The same identity the in-flight limit counts: the user where one is named, else the connection.
        tenant = submit.user if submit.user is not None else b"/".join(client).hex()
        self.core.add_request(
            rid,
            tokens,
            submit.sampling,
            now,
            deadline=now + timeout,
            tenant=tenant,
            lora=lora,
            detokenize=submit.detokenize,
        )
        self.metrics.tokens.labels("prompt").inc(len(tokens))
        self.log.info(
            "request_accepted",
            request_id=rid,
            prompt_tokens=len(tokens),
            max_tokens=submit.sampling.max_tokens,
            n=submit.sampling.n,
        )
        send(self.sock, Accepted(request_id=rid, num_prompt_tokens=len(tokens)), to=client)

    def _replay(self, rid: str, client: Route) -> None:
        """A reconnected client gets everything so far; it keeps what it lacks by offset."""
        completions = self.core.completions(rid)
        num_prompt_tokens = len(completions[0].prompt_token_ids)
        send(self.sock, Accepted(request_id=rid, num_prompt_tokens=num_prompt_tokens), to=client)
        if not self.clients.streaming.get(rid):
            return
        for req in completions:
            if req.output_token_ids:
                delta = Delta(
                    request_id=rid,
                    index=req.index,
                    token_ids=list(req.output_token_ids),
                    text=self.core.emitted_text(req),
                    prompt_logprobs=req.prompt_logprobs,
                )
                send(self.sock, delta, to=client)

    def locate(self, rid: str) -> Literal["live", "finished", "unknown"]:
        if self.core.is_live(rid):
            return "live"
        return "finished" if self.finished.get(rid) is not None else "unknown"

    def abort(self, rid: str, now: float) -> None:
        if not self.core.is_live(rid):
            raise RequestRejected("unknown_request", f"request_id: {rid!r} is not live")
        generated = sum(len(req.output_token_ids) for req in self.core.completions(rid))
        self.log.info("request_aborted", request_id=rid, output_tokens=generated)
        self.dispatch(self.core.abort(rid), now)

    def abort_lapsed_clients(self, now: float, client_timeout_s: float) -> None:
        """A client whose heartbeats stopped is gone: its requests end, their blocks come back."""
        for client, ids in self.clients.lapsed(now, client_timeout_s):
            self.log.warning("client_lost", requests=ids)
            for rid in ids:
                self.dispatch(self.core.abort(rid), now)
            self.clients.last_seen.pop(client, None)

    # ------------------------------------------------------------------ events -> clients

    def dispatch(self, events: list[OutputEvent | RequestDone], now: float) -> None:
        for event in events:
            if isinstance(event, OutputEvent):
                self._send_delta(event, now)
            else:
                self._send_done(event, now)

    def _send_delta(self, ev: OutputEvent, now: float) -> None:
        sent = self.streams.setdefault((ev.request_id, ev.index), [0, 0])
        if sent[0] == 0 and ev.token_ids and (group := self.core.completions(ev.request_id)):
            self.metrics.ttft.observe(now - group[0].arrival)
        self.metrics.tokens.labels("generated").inc(len(ev.token_ids))
        client = self.clients.route.get(ev.request_id)
        if client is not None and self.clients.streaming.get(ev.request_id) and (ev.token_ids or ev.text):
            # Per token: built without validation, the scheduler is its own trusted author.
            delta = Delta.model_construct(
                request_id=ev.request_id,
                index=ev.index,
                offset=sent[0],
                text_offset=sent[1],
                token_ids=ev.token_ids,
                text=ev.text,
                logprobs=ev.logprobs,
                prompt_logprobs=ev.prompt_logprobs,
            )
            send(self.sock, delta, to=client)
        sent[0] += len(ev.token_ids)
        sent[1] += len(ev.text)

    def _send_done(self, done: RequestDone, now: float) -> None:
        for req in done.completions:
            self.streams.pop((done.request_id, req.index), None)
            if (
                req.first_token_at is not None
                and req.last_token_at is not None
                and len(req.output_token_ids) > 1
            ):
                self.metrics.itl.observe(
                    (req.last_token_at - req.first_token_at) / (len(req.output_token_ids) - 1)
                )
        head = done.completions[0]
        self.metrics.e2e.observe(now - head.arrival)
        self.metrics.finished.labels(done.error_code or head.finish_reason or "unknown").inc()
        client = self.clients.done(done.request_id)
        if done.error_code is not None:
            message = done.error_message or _ERROR_MESSAGES.get(done.error_code, done.error_code)
            reply: Finished | Error = Error(code=done.error_code, message=message, request_id=done.request_id)
        else:
            reply = Finished(
                request_id=done.request_id,
                outputs=done.completion_outputs("abort"),
                usage=Usage(
                    prompt_tokens=done.num_prompt_tokens,
                    completion_tokens=done.num_completion_tokens,
                    cached_tokens=done.num_cached_tokens,
                ),
                prompt_logprobs=done.prompt_logprobs,
                pooled=done.pooled,
            )
        self.finished.put(done.request_id, reply)
        self.log.info(
            "request_finished",
            request_id=done.request_id,
            reason=done.error_code or head.finish_reason,
            completion_tokens=done.num_completion_tokens,
        )
        if client is not None:
            send(self.sock, reply, to=client)
