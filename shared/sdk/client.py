"""The blocking client. Safe to share between threads.

One background I/O thread owns the ZeroMQ socket (sockets are not thread-safe): callers hand it
commands through a queue and get their request's events back on a queue of their own. The thread
also keeps the heartbeat going while callers are busy elsewhere, and reconnects when the server goes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from types import TracebackType
from typing import Any, Literal

import zmq

from pagedserve.shared.completion_text import text_decoder
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.sdk.connection import Connection, SocketOptions, Waker
from pagedserve.shared.sdk.request_state import Event, LiveRequest, make_submit
from pagedserve.shared.sdk.results import RequestError, Result
from pagedserve.shared.sdk.session import Session
from pagedserve.shared.sdk.streams import PendingRequest, Stream

log = logging.getLogger("pagedserve.sdk")

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
# The server enforces the same timeout and says why it gave up (e.g. "no_workers"): the client's
# own "timeout" comes a little later so that the server's answer wins.
SERVER_GRACE_S = 0.5
# Room for one full recovery before a request gives up: a stuck step is noticed within the
# scheduler's step timeout (step_timeout_s, at most 60 s by default), its requests requeue at once,
# and a worker that had to be restarted reloads its model (seconds to a minute) before they
# recompute. A stream is judged by inactivity (no new token for DEFAULT_IDLE_TIMEOUT_S), so a long
# one that keeps producing runs on until the total timeout.
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_IDLE_TIMEOUT_S = 180.0

Command = tuple[Literal["submit"], LiveRequest] | tuple[Literal["abort"], str] | tuple[Literal["close"], None]


class Client:
    """Talks to a pagedserve scheduler. Every method may be called from any thread.

        with Client("tcp://127.0.0.1:5555") as client:
            result = client.generate("Hello", max_tokens=32, temperature=0.0)
            print(result.text, result.usage)
            for delta in client.stream("Once upon a time", max_tokens=64):
                print(delta.text, end="", flush=True)

    `timeout_s` is the default per-request timeout, and a stream also fails after `idle_timeout_s`
    without a new token (None: never); pings go out every `heartbeat_s` while requests
    are live; after `reconnect_after_s` of silence (or when the connection drops) the client opens
    a new socket and re-attaches its live requests, without a gap or a repeat in their streams.
    For CURVE encryption pass the server's public key, and optionally this client's key pair
    (see `load_client_keys`). Given the model's `tokenizer` (anything with `decode(ids,
    skip_special_tokens)` and `encode(text)`), the client tokenizes prompts, makes the text and
    matches stop strings itself, and the scheduler deals in token ids only: that work leaves the
    scheduler's one thread.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
        heartbeat_s: float = 0.5,
        reconnect_after_s: float = 3.0,
        max_message_bytes: int = 64 << 20,
        curve_server_public_key: bytes | None = None,
        curve_client_keys: tuple[bytes, bytes] | None = None,
        tokenizer: Any | None = None,
    ) -> None:
        check_positive(
            timeout_s=timeout_s,
            idle_timeout_s=idle_timeout_s if idle_timeout_s is not None else 1.0,
            heartbeat_s=heartbeat_s,
            reconnect_after_s=reconnect_after_s,
            max_message_bytes=max_message_bytes,
        )
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        # Given the model's tokenizer, this client makes the text itself (shared/sdk/client_text.py).
        self._tokenizer = tokenizer
        self._decode = text_decoder(tokenizer)
        options = SocketOptions(endpoint, max_message_bytes, curve_server_public_key, curve_client_keys)
        self._ctx = zmq.Context()
        self._session = Session(heartbeat_s, reconnect_after_s, max_message_bytes, idle_timeout_s)
        self._conn = Connection(self._ctx, options, min_reopen_s=heartbeat_s)
        self._waker = Waker(self._ctx)
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders commands against close()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="pagedserve-sdk-io", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API

    def generate(
        self,
        prompt: str | None = None,
        *,
        prompt_token_ids: list[int] | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
        sampling_params: SamplingParams | None = None,
        **sampling: Any,
    ) -> Result:
        """Run one request to the end. `**sampling` takes any SamplingParams field.

            result = client.generate("Hello", max_tokens=32, temperature=0.0)
            result = client.generate(prompt_token_ids=[1, 2, 3], max_tokens=8, n=2, seed=7)
            texts = [c.text for c in result.outputs]

        Raises RequestError (server refusals, "timeout", "closed") and pydantic's ValidationError
        for a bad argument, before anything is sent.
        """
        pending = self._start(
            prompt, prompt_token_ids, request_id, timeout_s, sampling_params, sampling, False
        )
        try:
            while True:
                event = pending.next_event()
                if isinstance(event, Result):
                    return event
        except BaseException:  # a timeout, a Ctrl-C: the server need not finish it
            pending.abandon()
            raise

    def stream(
        self,
        prompt: str | None = None,
        *,
        prompt_token_ids: list[int] | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
        sampling_params: SamplingParams | None = None,
        **sampling: Any,
    ) -> Stream:
        """Submit now; iterate the returned Stream for StreamDeltas as tokens are generated.

            stream = client.stream("Hello", max_tokens=32)
            for delta in stream:
                print(delta.text, end="")
            print(stream.result.finish_reason)

        Leaving the loop early (break, an exception) or `stream.close()` aborts the request.
        """
        pending = self._start(
            prompt, prompt_token_ids, request_id, timeout_s, sampling_params, sampling, True
        )
        return Stream(pending)

    def abort(self, request_id: str) -> None:
        """Ask the server to stop a request: its generate() returns (or its stream ends) with
        finish_reason "abort". Does not wait for the server."""
        self._command(("abort", request_id))

    def close(self) -> None:
        """End the I/O thread (live requests fail with RequestError("closed")) and free the sockets."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._commands.put(("close", None))
        self._waker.wake()
        self._thread.join(timeout=5.0)
        if self._thread.is_alive():  # should not happen: never block the caller on a stuck thread
            log.error("pagedserve sdk: the I/O thread did not stop; leaving its sockets open")
            return
        self._waker.close()
        self._ctx.term()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ caller side

    def _start(
        self,
        prompt: str | None,
        prompt_token_ids: list[int] | None,
        request_id: str | None,
        timeout_s: float | None,
        sampling_params: SamplingParams | None,
        sampling: dict[str, Any],
        stream: bool,
    ) -> PendingRequest:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        submit = make_submit(
            prompt,
            prompt_token_ids,
            request_id=request_id,
            timeout_s=timeout,
            stream=stream,
            sampling_params=sampling_params,
            sampling=sampling,
            tokenizer=self._tokenizer,
        )
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        req = LiveRequest.start(submit, time.monotonic() + timeout + SERVER_GRACE_S, events, self._decode)
        self._command(("submit", req))
        return PendingRequest(req.request_id, events, req.deadline, self._abort_quietly)

    def _abort_quietly(self, request_id: str) -> None:
        # Closed: the server aborts the request anyway when our heartbeat lapses.
        with contextlib.suppress(RequestError):
            self.abort(request_id)

    def _command(self, command: Command) -> None:
        with self._lock:
            if self._closed:
                raise RequestError("closed", "the client is closed")
            self._commands.put(command)
        self._waker.wake()

    # ------------------------------------------------------------------ the I/O thread

    def _run(self) -> None:
        code, message = "closed", "the client was closed"
        try:
            self._loop()
        except Exception as exc:  # a bug, not a network fault: fail loudly, but fail every waiter
            log.exception("pagedserve sdk: the I/O thread failed")
            code, message = "internal", f"the client's I/O thread failed: {type(exc).__name__}: {exc}"
        finally:
            self._shutdown(code, message)

    def _loop(self) -> None:
        poller, generation = zmq.Poller(), -1
        while True:
            if generation != self._conn.generation:  # a reconnect made new sockets
                poller = zmq.Poller()
                for sock in (self._conn.dealer, self._conn.monitor, self._waker.rx):
                    poller.register(sock, zmq.POLLIN)
                generation = self._conn.generation
            wait = self._session.next_wakeup(time.monotonic())
            ready = {sock for sock, _ in poller.poll(poll_timeout_ms(wait))}
            if self._waker.rx in ready:
                self._waker.drain()
                if self._run_commands():
                    return
            self._conn.service(self._session, ready, time.monotonic())

    def _run_commands(self) -> bool:
        """Carry out queued commands; True when one of them is close."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return False
            # Read by index, not unpacked: the tag command[0] narrows which argument command[1] is.
            if command[0] == "close":
                return True
            if command[0] == "abort":
                self._conn.send(self._session.abort(command[1]))
                continue
            try:
                self._conn.send(self._session.submit(command[1], time.monotonic()))
            except RequestError as exc:
                command[1].sink.put_nowait(exc)

    def _shutdown(self, code: str, message: str) -> None:
        with self._lock:
            self._closed = True  # nothing can be queued after this
        while True:  # commands that came too late
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command[0] == "submit":
                req = command[1]
                req.sink.put_nowait(RequestError(code, message, req.request_id))
        # Tell the server now rather than let it wait for our heartbeat to lapse.
        for frame in self._session.fail_all(code, message):
            self._conn.send(frame)
        self._conn.close()


def poll_timeout_ms(wait_s: float | None) -> int | None:
    """A poll timeout for a clock `wait_s` away: rounded up, and never 0 (that would spin)."""
    return None if wait_s is None else max(1, math.ceil(wait_s * 1000))


def check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
