"""SocketWaiter over real ZeroMQ sockets: it wakes for a message, times out without one, sees a message
whose fd news a send took, and follows sockets that replace closed ones. Waits that must end by a
message have no timeout of their own; a guard fails the test instead of letting it hang."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable

import pytest
import zmq

from pagedserve.shared.sdk.socket_waiter import SocketWaiter


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.term()


def pair(ctx: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    """A ROUTER on loopback TCP and a DEALER connected to it, the SDK's shape."""
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, uuid.uuid4().hex.encode())
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send(b"hello")
    identity, _ = router.recv_multipart()  # connected both ways
    return router, dealer, identity


def guarded(wait: Awaitable[set[zmq.Socket]]) -> Awaitable[set[zmq.Socket]]:
    """A wait for a message, failed (TimeoutError) rather than hung if the message never wakes it."""
    return asyncio.wait_for(wait, 30.0)


def close(*socks: zmq.Socket) -> None:
    for sock in socks:
        sock.close(linger=0)


def test_wakes_for_a_message_sent_while_it_waits(ctx: zmq.Context) -> None:
    router, dealer, identity = pair(ctx)

    async def main() -> set[zmq.Socket]:
        waiter = SocketWaiter(asyncio.get_running_loop())
        waiter.watch([dealer])
        asyncio.get_running_loop().call_later(0.05, router.send_multipart, [identity, b"token"])
        ready = await guarded(waiter.wait(None))
        waiter.close()
        return ready

    assert asyncio.run(main()) == {dealer}
    assert dealer.recv(zmq.NOBLOCK) == b"token"
    close(router, dealer)


def test_times_out_empty_without_a_message(ctx: zmq.Context) -> None:
    router, dealer, _ = pair(ctx)

    async def main() -> set[zmq.Socket]:
        waiter = SocketWaiter(asyncio.get_running_loop())
        waiter.watch([dealer])
        ready = await waiter.wait(0.1)
        waiter.close()
        return ready

    assert asyncio.run(main()) == set()
    close(router, dealer)


def test_sees_a_message_whose_fd_news_a_send_took(ctx: zmq.Context) -> None:
    """A send processes the socket's pending commands, an arrival among them, and the fd goes quiet:
    the waiter must still return at once rather than sleep to its timeout."""
    router, dealer, identity = pair(ctx)
    router.send_multipart([identity, b"token"])
    deadline = time.monotonic() + 5
    while not dealer.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # the arrival is processed, the fd reset
        assert time.monotonic() < deadline
        time.sleep(0.001)
    dealer.send(b"more")

    async def main() -> set[zmq.Socket]:
        waiter = SocketWaiter(asyncio.get_running_loop())
        waiter.watch([dealer])
        ready = await guarded(waiter.wait(None))  # nothing more will arrive to wake it
        waiter.close()
        return ready

    assert asyncio.run(main()) == {dealer}
    close(router, dealer)


def test_follows_new_sockets_after_the_old_ones_closed(ctx: zmq.Context) -> None:
    """A reconnect closes the sockets and opens new ones (often on the same fd numbers)."""
    router, dealer, _ = pair(ctx)

    async def main() -> bool:
        waiter = SocketWaiter(asyncio.get_running_loop())
        waiter.watch([dealer])
        close(router, dealer)
        router2, dealer2, identity2 = pair(ctx)
        waiter.watch([dealer2])
        asyncio.get_running_loop().call_later(0.05, router2.send_multipart, [identity2, b"again"])
        woken_by_new = await guarded(waiter.wait(None)) == {dealer2}
        waiter.close()
        assert dealer2.recv(zmq.NOBLOCK) == b"again"
        close(router2, dealer2)
        return woken_by_new

    assert asyncio.run(main())
