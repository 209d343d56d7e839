"""The asyncio client. Safe to share between tasks of one event loop.

One reader task owns the clocks and the incoming side of the socket and hands each request's
events to that request's asyncio.Queue. Callers submit and abort directly: everything runs on the
loop's thread, so the socket is never touched by two threads at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import TracebackType
from typing import Any

import zmq

from pagedserve.shared.completion_text import text_decoder
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.sdk.client import (
    DEFAULT_ENDPOINT,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    SERVER_GRACE_S,
    check_positive,
    poll_timeout_ms,
)
from pagedserve.shared.sdk.connection import Connection, SocketOptions, Waker
from pagedserve.shared.sdk.request_state import Event, LiveRequest, make_submit
from pagedserve.shared.sdk.results import RequestError, Result
from pagedserve.shared.sdk.session import Session
from pagedserve.shared.sdk.socket_waiter import SocketWaiter
from pagedserve.shared.sdk.streams import AsyncPendingRequest, AsyncStream

log = logging.getLogger("pagedserve.sdk")


class AsyncClient:
    """Talks to a pagedserve scheduler from asyncio; same options as Client.

    async with AsyncClient("tcp://127.0.0.1:5555") as client:
        result = await client.generate("Hello", max_tokens=32)
        async for delta in client.stream("Once upon a time", max_tokens=64):
            print(delta.text, end="", flush=True)
        results = await asyncio.gather(*(client.generate(p, max_tokens=8) for p in prompts))
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
        # Plain (blocking) sockets, read with NOBLOCK; only the waiting is asyncio's (SocketWaiter).
        self._ctx = zmq.Context()
        self._session = Session(heartbeat_s, reconnect_after_s, max_message_bytes, idle_timeout_s)
        self._conn = Connection(self._ctx, options, min_reopen_s=heartbeat_s)
        self._waker = Waker(self._ctx)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False
        self._broken: str | None = None  # why the reader task died, if it did

    # ------------------------------------------------------------------ public API

    async def generate(
        self,
        prompt: str | None = None,
        *,
        prompt_token_ids: list[int] | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
        sampling_params: SamplingParams | None = None,
        **sampling: Any,
    ) -> Result:
        """Run one request to the end; see Client.generate. Cancelling the task aborts the request.

        result = await client.generate("Hello", max_tokens=32, temperature=0.0)
        """
        pending = self._start(
            prompt, prompt_token_ids, request_id, timeout_s, sampling_params, sampling, False
        )
        try:
            while True:
                event = await pending.next_event()
                if isinstance(event, Result):
                    return event
        except BaseException:  # CancelledError included: nobody wants the result any more
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
    ) -> AsyncStream:
        """Submit now (call it inside the event loop); iterate with `async for`.

        stream = client.stream("Hello", max_tokens=32)
        async for delta in stream:
            print(delta.text, end="")
        print(stream.result.usage)
        """
        pending = self._start(
            prompt, prompt_token_ids, request_id, timeout_s, sampling_params, sampling, True
        )
        return AsyncStream(pending)

    async def abort(self, request_id: str) -> None:
        """Ask the server to stop a request (its result gets finish_reason "abort"); does not wait."""
        self._check_usable()
        self._abort_now(request_id)

    async def close(self) -> None:
        """Stop the reader task (live requests fail with RequestError("closed")) and free the sockets."""
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        for frame in self._session.fail_all("closed", "the client was closed"):
            self._conn.send(frame)
        self._conn.close()
        self._waker.close()
        # term() waits out the close linger (the final Aborts): not on the loop's thread.
        await asyncio.to_thread(self._ctx.term)

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> AsyncClient:
        self._ensure_reader()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

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
    ) -> AsyncPendingRequest:
        self._check_usable()
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
        self._ensure_reader()
        events: asyncio.Queue[Event] = asyncio.Queue()
        now = time.monotonic()
        req = LiveRequest.start(submit, now + timeout + SERVER_GRACE_S, events, self._decode)
        self._conn.send(self._session.submit(req, now))
        self._waker.wake()  # the reader's clocks changed: let it recompute its wait
        return AsyncPendingRequest(req.request_id, events, req.deadline, self._abort_soon)

    def _check_usable(self) -> None:
        if self._closed:
            raise RequestError("closed", "the client is closed")
        if self._broken is not None:
            raise RequestError("internal", self._broken)

    def _ensure_reader(self) -> None:
        if self._reader is None:
            self._loop = asyncio.get_running_loop()
            self._reader = self._loop.create_task(self._read(), name="pagedserve-sdk-reader")

    def _abort_now(self, request_id: str) -> None:
        if not self._closed and self._broken is None:
            self._conn.send(self._session.abort(request_id))
            self._waker.wake()  # the send may have taken the socket's news of an arrival (SocketWaiter)

    def _abort_soon(self, request_id: str) -> None:
        """Abort from anywhere, even a finalizer on another thread: the socket is used on the loop only."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is self._loop:
            self._abort_now(request_id)
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._abort_now, request_id)

    # ------------------------------------------------------------------ the reader task

    async def _read(self) -> None:
        assert self._loop is not None
        waiter, generation = SocketWaiter(self._loop), -1
        try:
            while True:
                if generation != self._conn.generation:  # a reconnect made new sockets
                    waiter.watch((self._conn.dealer, self._conn.monitor, self._waker.rx))
                    generation = self._conn.generation
                timeout_ms = poll_timeout_ms(self._session.next_wakeup(time.monotonic()))
                ready = await waiter.wait(None if timeout_ms is None else timeout_ms / 1000)
                if self._waker.rx in ready:
                    self._waker.drain()
                self._conn.service(self._session, ready, time.monotonic())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug, not a network fault: fail every waiter rather than hang them
            log.exception("pagedserve sdk: the reader task failed")
            self._broken = f"the client's reader task failed: {type(exc).__name__}: {exc}"
            self._session.fail_all("internal", self._broken)
        finally:
            waiter.close()  # before the sockets close: the loop must not watch their fds
