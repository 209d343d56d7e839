"""Noticing a client that hung up, streaming or not, so that its request is aborted at once.

Starlette cancels a streaming response when a write fails, but a non-streaming handler just keeps
awaiting its result, and the request keeps its KV blocks until it ends: the leak this file prevents.
Once the body is read, the ASGI receive channel yields nothing more until `http.disconnect`, so a
task waiting on it learns of the hang-up as soon as the server does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client hung up first"; nobody reads it


class ClientGone(Exception):
    """The HTTP client closed its connection before its answer was ready."""


async def wait_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`await work`, unless the client hangs up first: then `work` is cancelled (its requests are
    aborted by the cancellation) and ClientGone is raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # we were cancelled ourselves (shutdown): take the work down with us
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGone


def on_disconnect(request: Request, callback: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    """Run `callback` when the client hangs up; cancel the returned task when no longer needed."""

    async def watch() -> None:
        await wait_disconnected(request)
        await callback()

    return asyncio.create_task(watch())


async def on_client_gone(request: Request, exc: Exception) -> Response:
    """The app's handler: a route that raised ClientGone is answered 499 (the metrics count it)."""
    assert isinstance(exc, ClientGone)
    return Response(status_code=CLIENT_CLOSED_REQUEST)
