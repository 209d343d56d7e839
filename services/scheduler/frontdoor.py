"""The scheduler's front door: turn raw client frames into validated requests, or one clear Error.

Pure apart from the tokenizer: no sockets. Every refusal names the field and the limit, and
changes nothing: the caller sends the Error and goes on serving.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pagedserve.services.scheduler.admission import RequestRejected, check_request
from pagedserve.shared.protocol.frontend import CLIENT_MESSAGES, Abort, Error, Finished, Ping, Submit
from pydantic import ValidationError


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "(message)"
        ctx = err.get("ctx") or {}
        limit = ", ".join(f"{k}={v}" for k, v in ctx.items() if k != "error")
        parts.append(f"{loc}: {err['msg']}" + (f" ({limit})" if limit else ""))
    more = len(exc.errors()) - 3
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_client_message(msg: dict[str, Any]) -> Submit | Abort | Ping:
    """Validate a decoded frame against the client message types; raises RequestRejected."""
    kind = msg.get("type")
    model = CLIENT_MESSAGES.get(kind)  # type: ignore[arg-type]
    if model is None:
        raise RequestRejected(
            "unknown_type", f"type: unknown message type {kind!r}; expected one of {sorted(CLIENT_MESSAGES)}"
        )
    body = {k: v for k, v in msg.items() if k != "v"}
    try:
        return model.model_validate(body)  # type: ignore[return-value]
    except ValidationError as exc:
        raise RequestRejected("invalid_request", describe_validation_error(exc)) from None


@dataclass(slots=True)
class ClientBook:
    """Who asked for what: routes, liveness and per-client limits."""

    max_inflight: int
    route: dict[str, bytes] = field(default_factory=dict)  # request id -> client identity
    streaming: dict[str, bool] = field(default_factory=dict)
    live: dict[bytes, set[str]] = field(default_factory=dict)  # client -> its live request ids
    last_seen: dict[bytes, float] = field(default_factory=dict)

    def seen(self, client: bytes, now: float) -> None:
        self.last_seen[client] = now

    def admit(self, client: bytes, request_id: str, stream: bool) -> None:
        ids = self.live.setdefault(client, set())
        if len(ids) >= self.max_inflight:
            raise RequestRejected(
                "too_many_requests",
                f"this client already has {len(ids)} requests in flight; "
                f"the limit is max_inflight_per_client={self.max_inflight}",
            )
        ids.add(request_id)
        self.route[request_id] = client
        self.streaming[request_id] = stream

    def reroute(self, client: bytes, request_id: str, stream: bool) -> None:
        old = self.route.get(request_id)
        if old is not None and old in self.live:
            self.live[old].discard(request_id)
        self.live.setdefault(client, set()).add(request_id)
        self.route[request_id] = client
        self.streaming[request_id] = stream

    def done(self, request_id: str) -> bytes | None:
        client = self.route.pop(request_id, None)
        self.streaming.pop(request_id, None)
        if client is not None and client in self.live:
            self.live[client].discard(request_id)
            if not self.live[client]:
                del self.live[client]
        return client

    def lapsed(self, now: float, timeout_s: float) -> list[tuple[bytes, list[str]]]:
        """Clients with live requests whose heartbeats stopped."""
        out = []
        for client, ids in self.live.items():
            if ids and now - self.last_seen.get(client, now) > timeout_s:
                out.append((client, sorted(ids)))
        return out


class FinishedStore:
    """Results of finished requests, so a retry by request id is a lookup, not a second run."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Finished | Error] = OrderedDict()

    def put(self, request_id: str, reply: Finished | Error) -> None:
        self._items[request_id] = reply
        self._items.move_to_end(request_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, request_id: str) -> Finished | Error | None:
        return self._items.get(request_id)


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


__all__ = ["ClientBook", "Finished", "FinishedStore", "parse_client_message", "tokenize_submit"]
