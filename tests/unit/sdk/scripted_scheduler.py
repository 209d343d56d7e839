"""A scripted stand-in for the scheduler's front ROUTER, for the SDK's tests.

A real ZeroMQ ROUTER on tcp://127.0.0.1:<free port>, served by a thread. Output is deterministic
(see `expected_tokens` / `expected_text`), so a test can check that each caller got its own
tokens, each exactly once. The prompt picks the behaviour:

    "error:<code>"  answered with Error{code}
    "hang"          Accepted, then nothing until aborted
    anything else   max_tokens tokens, one every `token_interval_s`

and knobs break the connection in the two ways the SDK must survive:

    crash_after_tokens  after this many deltas the server dies (its socket closes) and comes back
                        `downtime_s` later on the same port, remembering nothing (a restart)
    mute_after_tokens   after this many deltas the server stops talking to that client connection
                        (frames both ways dropped) but keeps generating: a connection gone dark
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import zmq

from pagedserve.shared.protocol.codec import decode, encode


def _tag(prompt: str | None, prompt_token_ids: list[int] | None) -> str:
    return prompt if prompt is not None else "ids" + "_".join(map(str, prompt_token_ids or []))


def expected_tokens(
    prompt: str | None, max_tokens: int, index: int = 0, prompt_token_ids: list[int] | None = None
) -> list[int]:
    base = zlib.crc32(_tag(prompt, prompt_token_ids).encode()) % 10_000 * 1000 + index * 100
    return [base + i for i in range(max_tokens)]


def expected_text(
    prompt: str | None, max_tokens: int, index: int = 0, prompt_token_ids: list[int] | None = None
) -> str:
    return "".join(_piece(_tag(prompt, prompt_token_ids), index, i) for i in range(max_tokens))


def _piece(tag: str, index: int, i: int) -> str:
    return (
        f"{tag}/{index}/{i} " if i % 2 else f"{tag}·{index}·{i} "
    )  # some non-ASCII: offsets count characters


@dataclass
class _Request:
    request_id: str
    client: bytes
    tag: str
    n: int
    max_tokens: int
    stream: bool
    hang: bool
    produced: int = 0
    next_at: float = 0.0
    prompt_tokens: int = 0


@dataclass
class ScriptedScheduler:
    token_interval_s: float = 0.005
    crash_after_tokens: int | None = None
    downtime_s: float = 0.2
    mute_after_tokens: int | None = None
    mute_for_s: float = 60.0
    answer_pings: bool = True
    curve_secret_key: bytes | None = None
    curve_public_key: bytes | None = None

    received: list[tuple[int, bytes, dict[str, Any]]] = field(
        default_factory=list
    )  # (incarnation, client, msg)
    incarnation: int = 0
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _requests: dict[str, _Request] = field(default_factory=dict)
    _finished: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    _deltas_sent: int = 0
    _muted: dict[bytes, float] = field(default_factory=dict)  # client -> muted until

    # ------------------------------------------------------------------ test-facing

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def __enter__(self) -> ScriptedScheduler:
        self._ctx = zmq.Context()
        self._router = self._bind()
        self._thread = threading.Thread(target=self._serve, name="scripted-scheduler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._router.close(linger=0)
        self._ctx.term()

    def messages(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [msg for _, _, msg in self.received if msg.get("type") == kind]

    def wait_for(self, kind: str, count: int = 1, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.messages(kind)
            if len(found) >= count:
                return found
            time.sleep(0.005)
        raise AssertionError(f"expected {count} {kind!r} messages, got {self.messages(kind)}")

    # ------------------------------------------------------------------ the server thread

    def _bind(self) -> zmq.Socket:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve_secret_key is not None:
            sock.curve_secretkey = self.curve_secret_key
            sock.curve_publickey = self.curve_public_key
            sock.curve_server = True
        if self.port == 0:
            self.port = sock.bind_to_random_port("tcp://127.0.0.1")
            return sock
        deadline = time.monotonic() + 5.0
        while True:  # the old listener may take a moment to let go of the port
            try:
                sock.bind(self.endpoint)
                return sock
            except zmq.ZMQError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _serve(self) -> None:
        while not self._stop.is_set():
            if (
                self.crash_after_tokens is not None
                and self.incarnation == 0
                and self._deltas_sent >= self.crash_after_tokens
            ):
                self._restart()
            if self._router.poll(5, zmq.POLLIN):
                while True:
                    try:
                        client, frame = self._router.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_message(client, decode(frame))
            self._generate(time.monotonic())

    def _restart(self) -> None:
        self._router.close(linger=0)
        self._stop.wait(self.downtime_s)
        self._requests.clear()
        self._finished.clear()
        self.incarnation += 1
        self._router = self._bind()

    def _send(self, client: bytes, kind: str, body: dict[str, Any]) -> None:
        if self._muted.get(client, 0.0) > time.monotonic():
            return
        self._router.send_multipart([client, encode(kind, body)])

    def _on_message(self, client: bytes, msg: dict[str, Any]) -> None:
        if self._muted.get(client, 0.0) > time.monotonic():
            return
        with self._lock:
            self.received.append((self.incarnation, client, msg))
        kind, rid = msg["type"], msg.get("request_id")
        if kind == "ping":
            if self.answer_pings:
                self._send(client, "pong", {})
        elif kind == "abort":
            req = self._requests.get(rid)
            if req is None:
                self._send(
                    client, "error", {"code": "unknown_request", "message": "not live", "request_id": rid}
                )
            else:
                self._finish(req, "abort")
        elif kind == "submit":
            self._on_submit(client, msg)

    def _on_submit(self, client: bytes, msg: dict[str, Any]) -> None:
        rid, prompt = msg["request_id"], msg.get("prompt")
        if rid in self._finished:
            self._send(client, *self._finished[rid])
            return
        if rid in self._requests:  # attach: reroute and replay everything so far
            req = self._requests[rid]
            req.client, req.stream = client, msg["stream"]
            self._send(client, "accepted", {"request_id": rid, "num_prompt_tokens": req.prompt_tokens})
            if req.stream and req.produced:
                for index in range(req.n):
                    self._send_delta(req, index, 0, req.produced)
            return
        if prompt is not None and prompt.startswith("error:"):
            self._send(client, "error", {"code": prompt[6:], "message": "scripted", "request_id": rid})
            return
        ids = msg.get("prompt_token_ids")
        sampling = msg["sampling"]
        req = _Request(
            rid,
            client,
            _tag(prompt, ids),
            sampling["n"],
            sampling["max_tokens"],
            msg["stream"],
            hang=prompt == "hang",
            next_at=time.monotonic() + self.token_interval_s,
            prompt_tokens=len(ids) if ids is not None else len(prompt.split()),
        )
        self._requests[rid] = req
        self._send(client, "accepted", {"request_id": rid, "num_prompt_tokens": req.prompt_tokens})

    def _generate(self, now: float) -> None:
        for req in list(self._requests.values()):
            if req.hang or now < req.next_at:
                continue
            req.produced += 1
            req.next_at = now + self.token_interval_s
            if req.stream:
                for index in range(req.n):
                    self._send_delta(req, index, req.produced - 1, req.produced)
            if req.produced == req.max_tokens:
                self._finish(req, "length")

    def _send_delta(self, req: _Request, index: int, start: int, end: int) -> None:
        tokens = expected_tokens(req.tag, end, index)[start:]
        text = expected_text(req.tag, end, index)
        text_offset = len(expected_text(req.tag, start, index))
        self._send(
            req.client,
            "delta",
            {
                "request_id": req.request_id,
                "index": index,
                "offset": start,
                "text_offset": text_offset,
                "token_ids": tokens,
                "text": text[text_offset:],
                "logprobs": None,
            },
        )
        self._deltas_sent += 1
        if self.mute_after_tokens is not None and self._deltas_sent == self.mute_after_tokens:
            self._muted[req.client] = time.monotonic() + self.mute_for_s

    def _finish(self, req: _Request, reason: str) -> None:
        del self._requests[req.request_id]
        outputs = [
            {
                "index": i,
                "token_ids": expected_tokens(req.tag, req.produced, i),
                "text": expected_text(req.tag, req.produced, i),
                "finish_reason": reason,
                "logprobs": None,
            }
            for i in range(req.n)
        ]
        body = {
            "request_id": req.request_id,
            "outputs": outputs,
            "usage": {
                "prompt_tokens": req.prompt_tokens,
                "completion_tokens": req.produced * req.n,
                "cached_tokens": 0,
            },
        }
        self._finished[req.request_id] = ("finished", body)
        self._send(req.client, "finished", body)
