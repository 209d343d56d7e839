"""The client's side of the conversation with the scheduler, without sockets: live requests,
the heartbeat and reconnect clocks, and where each incoming message goes.

Both clients drive one Session from a single I/O thread or task; nothing here is thread-safe.
"""

from __future__ import annotations

import heapq
import logging

from pydantic import ValidationError

from pagedserve.shared.protocol.codec import ProtocolError, decode
from pagedserve.shared.protocol.frontend import (
    SERVER_MESSAGES,
    Abort,
    Accepted,
    Delta,
    Error,
    Finished,
    Ping,
    StopAt,
)
from pagedserve.shared.protocol.messages import encode_message, read_message
from pagedserve.shared.sdk.request_state import LiveRequest
from pagedserve.shared.sdk.results import RequestError, Result

log = logging.getLogger("pagedserve.sdk")

PING_FRAME = encode_message(Ping())


class Session:
    def __init__(
        self,
        heartbeat_s: float,
        reconnect_after_s: float,
        max_message_bytes: int,
        idle_timeout_s: float | None = None,
    ) -> None:
        self.heartbeat_s = heartbeat_s
        self.reconnect_after_s = reconnect_after_s
        self.max_message_bytes = max_message_bytes
        # A stream with no new token for this long fails "timeout" (None: only the total timeout).
        # Only streams: a plain request sees nothing between Accepted and Finished.
        self.idle_timeout_s = idle_timeout_s
        self.live: dict[str, LiveRequest] = {}
        # Heap of (deadline, seq, request); entries of requests that already ended are skipped when popped.
        self._deadlines: list[tuple[float, int, LiveRequest]] = []
        self._seq = 0
        self._last_rx = 0.0
        self._next_ping = 0.0
        self.outbox: list[bytes] = []  # frames the server's messages call for (StopAt), sent after reading

    # ------------------------------------------------------------------ caller -> server

    def submit(self, req: LiveRequest, now: float) -> bytes:
        """Register a request; returns the Submit frame to send."""
        if req.request_id in self.live:
            raise RequestError(
                "duplicate_request_id", "this client already has a live request with this id", req.request_id
            )
        if not self.live:
            # The silence clock and the heartbeat only run while something is live.
            self._last_rx = now
            self._next_ping = now + self.heartbeat_s
        self.live[req.request_id] = req
        req.last_event = now
        self._seq += 1
        heapq.heappush(self._deadlines, (self._due(req), self._seq, req))
        if len(self._deadlines) > 2 * len(self.live) + 64:
            # Ended requests stay in the heap until their deadline (up to timeout_s): a busy client
            # would hold every request of the last ten minutes. Keep only the live ones, amortised O(1).
            self._deadlines = [d for d in self._deadlines if self.live.get(d[2].request_id) is d[2]]
            heapq.heapify(self._deadlines)
        return req.submit_frame(now, attach=False)

    @property
    def num_tracked(self) -> int:
        """Requests this session still holds any state for (live, or ended and not yet dropped)."""
        return len(self._deadlines)

    def abort(self, request_id: str) -> bytes:
        req = self.live.get(request_id)
        if req is not None:
            req.aborting = True
        return encode_message(Abort(request_id=request_id))

    def resubmit(self, now: float) -> list[bytes]:
        """Frames for a fresh connection: every live request again, attached by id."""
        self._last_rx = now
        self._next_ping = now + self.heartbeat_s
        frames = []
        for req in self.live.values():
            frames.append(req.submit_frame(now, attach=True))
            if req.aborting:  # the abort may have died with the old connection
                frames.append(self.abort(req.request_id))
        return frames

    # ------------------------------------------------------------------ clocks

    def _due(self, req: LiveRequest) -> float:
        """When `req` fails: its total deadline, or sooner when a stream goes idle."""
        if self.idle_timeout_s is None or not req.submit.stream:
            return req.deadline
        return min(req.deadline, req.last_event + self.idle_timeout_s)

    def expire(self, now: float) -> list[bytes]:
        """Fail requests past their deadline; returns Abort frames so the server stops them too.

        A heap entry may be early (a stream's idle clock moved on since it was pushed): it is
        pushed again at the request's current due time, so each Delta costs no heap work."""
        frames = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, seq, req = heapq.heappop(self._deadlines)
            rid = req.request_id
            if self.live.get(rid) is not req:  # a request that ended, or an older one under a reused id
                continue
            due = self._due(req)
            if due > now:
                heapq.heappush(self._deadlines, (due, seq, req))
                continue
            del self.live[rid]
            if due < req.deadline:
                why = f"no new token for idle_timeout_s={self.idle_timeout_s}"
            else:
                why = f"no result within timeout_s={req.submit.timeout_s}"
            req.sink.put_nowait(RequestError("timeout", why, rid))
            frames.append(self.abort(rid))
        return frames

    def ping_due(self, now: float) -> bool:
        if not self.live or now < self._next_ping:
            return False
        self._next_ping = now + self.heartbeat_s
        return True

    def reconnect_due(self, now: float) -> bool:
        """Nothing at all (not even a Pong) for reconnect_after_s while requests are live."""
        return bool(self.live) and now - self._last_rx >= self.reconnect_after_s

    def next_wakeup(self, now: float) -> float | None:
        """Seconds until a clock needs the I/O loop; None when nothing is live."""
        if not self.live:
            return None
        due = min(self._next_ping, self._last_rx + self.reconnect_after_s)
        if self._deadlines:
            due = min(due, self._deadlines[0][0])
        return max(0.0, due - now)

    def fail_all(self, error_code: str, message: str) -> list[bytes]:
        """End every live request with a RequestError; returns Abort frames for the server."""
        frames = []
        for rid, req in self.live.items():
            req.sink.put_nowait(RequestError(error_code, message, rid))
            frames.append(encode_message(Abort(request_id=rid)))
        self.live.clear()
        self._deadlines.clear()
        return frames

    # ------------------------------------------------------------------ server -> caller

    def _stops(self, req: LiveRequest) -> None:
        """Stop strings this side found: the scheduler stops those completions there."""
        for index, num_tokens in req.stops:
            self.outbox.append(
                encode_message(StopAt(request_id=req.request_id, index=index, num_tokens=num_tokens))
            )
        req.stops.clear()

    def take_outbox(self) -> list[bytes]:
        frames, self.outbox = self.outbox, []
        return frames

    def on_frame(self, frame: bytes, now: float) -> None:
        self._last_rx = now  # anything at all proves the connection is alive
        try:
            message = read_message(decode(frame, self.max_message_bytes), SERVER_MESSAGES)
        except (ProtocolError, ValidationError) as exc:
            # A bad frame is the server's bug; dropping it keeps every other request going.
            log.warning("pagedserve sdk: dropped a bad frame from the server: %s", exc)
            return
        if isinstance(message, Accepted):
            req = self.live.get(message.request_id)
            if req is not None:
                req.num_prompt_tokens = message.num_prompt_tokens
                req.last_event = now
        elif isinstance(message, Delta):
            req = self.live.get(message.request_id)
            if req is not None:
                req.last_event = now
            if req is not None and req.submit.stream:
                delta = req.take_delta(message)
                if delta is not None and req.streams:
                    req.sink.put_nowait(delta)
                self._stops(req)
        elif isinstance(message, Finished):
            req = self.live.pop(message.request_id, None)
            if req is not None:
                rest, finished = req.finish(message)
                if req.streams:
                    for delta in rest:
                        req.sink.put_nowait(delta)
                req.sink.put_nowait(Result.from_finished(finished, req.num_prompt_tokens))
        elif isinstance(message, Error):
            req = self.live.pop(message.request_id, None) if message.request_id else None
            if req is not None:
                req.sink.put_nowait(RequestError(message.code, message.message, message.request_id))
            else:
                log.warning("pagedserve sdk: server error [%s] %s", message.code, message.message)
