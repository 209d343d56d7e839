"""The caller's end of a request: waiting on its events, and the Stream objects users iterate.

The I/O thread (or reader task) answers "timeout" at a request's deadline; the caller waits a
little longer than that, so a wait only runs out by itself if the I/O side is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType

from pagedserve.shared.sdk.request_state import Event
from pagedserve.shared.sdk.results import RequestError, Result, StreamDelta

CALLER_GRACE_S = 1.0


class _Pending:
    """One request seen from the caller: how long to wait, and whether it has ended.
    `abort` is called (once) if the caller gives up before the request ends."""

    __slots__ = ("_abort", "deadline", "done", "request_id")

    def __init__(self, request_id: str, deadline: float, abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self.deadline = deadline
        self.done = False
        self._abort = abort

    def _wait_s(self) -> float:
        return max(0.0, self.deadline + CALLER_GRACE_S - time.monotonic())

    def _settle(self, event: Event) -> StreamDelta | Result:
        if isinstance(event, Result | RequestError):
            self.done = True
        if isinstance(event, RequestError):
            raise event
        return event

    def abandon(self) -> None:
        if not self.done:
            self.done = True
            self._abort(self.request_id)


class PendingRequest(_Pending):
    """Seen from a thread: events arrive on a queue.SimpleQueue."""

    __slots__ = ("events",)

    def __init__(
        self, request_id: str, events: queue.SimpleQueue[Event], deadline: float, abort: Callable[[str], None]
    ) -> None:
        super().__init__(request_id, deadline, abort)
        self.events = events

    def next_event(self) -> StreamDelta | Result:
        try:
            event = self.events.get(timeout=self._wait_s())
        except queue.Empty:
            raise RequestError("timeout", "no answer from the client's I/O thread", self.request_id) from None
        return self._settle(event)


class AsyncPendingRequest(_Pending):
    """Seen from a task: events arrive on an asyncio.Queue."""

    __slots__ = ("events",)

    def __init__(
        self, request_id: str, events: asyncio.Queue[Event], deadline: float, abort: Callable[[str], None]
    ) -> None:
        super().__init__(request_id, deadline, abort)
        self.events = events

    async def next_event(self) -> StreamDelta | Result:
        if not self.events.empty():
            return self._settle(self.events.get_nowait())
        try:
            async with asyncio.timeout(self._wait_s()):
                event = await self.events.get()
        except TimeoutError:
            raise RequestError(
                "timeout", "no answer from the client's reader task", self.request_id
            ) from None
        return self._settle(event)


class Stream(Iterator[StreamDelta]):
    """A streaming request: iterate it for StreamDeltas; `result` is the Result once it ends.

        with client.stream("Hello", max_tokens=32) as stream:
            for delta in stream:
                print(delta.index, delta.token_ids, delta.text)
        print(stream.result.usage)

    Leaving the loop early, `close()`, or the `with` block exiting aborts an unfinished request.
    """

    def __init__(self, pending: PendingRequest) -> None:
        self._pending = pending
        self.result: Result | None = None

    @property
    def request_id(self) -> str:
        return self._pending.request_id

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> StreamDelta:
        if self._pending.done:
            raise StopIteration
        try:
            event = self._pending.next_event()
        except BaseException:
            self.close()
            raise
        if isinstance(event, Result):
            self.result = event
            raise StopIteration
        return event

    def close(self) -> None:
        """Abort the request if it has not finished."""
        self._pending.abandon()

    def __enter__(self) -> Stream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # A loop left by `break` drops the stream: abort so the server stops generating for nobody.
        with contextlib.suppress(Exception):
            self.close()


class AsyncStream(AsyncIterator[StreamDelta]):
    """A streaming request: `async for` it for StreamDeltas; `result` is the Result once it ends.

        async with client.stream("Hello", max_tokens=32) as stream:
            async for delta in stream:
                print(delta.text, end="")
        print(stream.result.usage)

    Leaving the loop early, `await aclose()`, or the `async with` block exiting aborts an
    unfinished request.
    """

    def __init__(self, pending: AsyncPendingRequest) -> None:
        self._pending = pending
        self.result: Result | None = None

    @property
    def request_id(self) -> str:
        return self._pending.request_id

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> StreamDelta:
        if self._pending.done:
            raise StopAsyncIteration
        try:
            event = await self._pending.next_event()
        except BaseException:  # CancelledError included
            self._pending.abandon()
            raise
        if isinstance(event, Result):
            self.result = event
            raise StopAsyncIteration
        return event

    async def aclose(self) -> None:
        """Abort the request if it has not finished."""
        self._pending.abandon()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._pending.abandon()
