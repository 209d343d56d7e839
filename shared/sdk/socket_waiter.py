"""Waiting on ZeroMQ sockets from an asyncio loop, each socket registered with the loop once.

zmq.asyncio.Poller wraps every socket and registers it with the loop on every poll, and drops
it again after: in the API at one token a step that was a quarter of the process's CPU. Here each
socket's notification fd stays registered until the sockets change. That fd says only that
something changed inside ZeroMQ (a send may take the news of an arrival with it), so whether a
message waits is always read from ZMQ_EVENTS: before every wait and after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import cast

import zmq


class SocketWaiter:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._socks: list[zmq.Socket] = []
        self._fds: list[int] = []
        self._wake: asyncio.Future[None] | None = None

    def watch(self, socks: Iterable[zmq.Socket]) -> None:
        """Wait on these sockets from now on (a reconnect made new ones)."""
        self.close()
        self._socks = list(socks)
        self._fds = [sock.fileno() for sock in self._socks]
        for fd in self._fds:
            self._loop.add_reader(fd, self._on_change)

    def readable(self) -> set[zmq.Socket]:
        return {sock for sock in self._socks if cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN}

    async def wait(self, timeout_s: float | None) -> set[zmq.Socket]:
        """The sockets with a message waiting: at once if any has one, else after the next change
        inside ZeroMQ or `timeout_s` (None: no limit), whichever comes first; empty if it brought none."""
        ready = self.readable()
        if ready:
            return ready
        self._wake = self._loop.create_future()
        timer = None if timeout_s is None else self._loop.call_later(timeout_s, self._on_change)
        try:
            await self._wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()
        return self.readable()

    def _on_change(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def close(self) -> None:
        """Unregister the fds; sockets closed since are fine (the selector forgets a closed fd)."""
        for fd in self._fds:
            self._loop.remove_reader(fd)
        self._fds = []
        self._socks = []
