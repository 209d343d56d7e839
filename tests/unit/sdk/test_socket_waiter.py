"""SocketWaiter over real ZeroMQ sockets: it wakes for a message, times out without one, sees a message
whose fd news a send took, and follows sockets that replace closed ones."""

from __future__ import annotations

import asyncio
import time
import uuid

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


def close(*socks: zmq.Socket) -> None:
    for sock in socks:
        sock.close(linger=0)


def test_wakes_for_a_message_sent_while_it_waits(ctx: zmq.Context) -> None:
    router, dealer, identity = pair(ctx)

    async def main() -> tuple[set[zmq.Socket], float]:
        waiter = SocketWaiter(asyncio.get_running_loop())
        waiter.watch([dealer])
        asyncio.get_running_loop().call_later(0.05, router.send_multipart, [identity, b"token"])
        start = time.monotonic()
        ready = await waiter.wait(5.0)
        waiter.close()
        return ready, time.monotonic() - start

    ready, waited = asyncio.run(main())
    assert ready == {dealer}
    assert waited < 2.0  # woken by the message, not the 5 s timeout
    assert dealer.recv(zmq.NOBLOCK) == b"token"
    close(router, dealer)


def test_times_out_empty_without_a_message(ctx: zmq.Context) -> None:
    router, dealer, _ = pair(ctx)

    async def main() -> tuple[set[zmq.Socket], float]:
        waiter = SocketWaiter(asyncio.get_running_loop())
        waiter.watch([dealer])
        start = time.monotonic()
        ready = await waiter.wait(0.1)
        waiter.close()
        return ready, time.monotonic() - start

    ready, waited = asyncio.run(main())
    assert ready == set()
    assert waited >= 0.1
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

    async def main() -> tuple[set[zmq.Socket], float]:
        waiter = SocketWaiter(asyncio.get_running_loop())
        waiter.watch([dealer])
        start = time.monotonic()
        ready = await waiter.wait(5.0)
        waiter.close()
        return ready, time.monotonic() - start

    ready, waited = asyncio.run(main())
    assert ready == {dealer}
    assert waited < 1.0
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
        woken_by_new = await waiter.wait(5.0) == {dealer2}
        waiter.close()
        assert dealer2.recv(zmq.NOBLOCK) == b"again"
        close(router2, dealer2)
        return woken_by_new

    assert asyncio.run(main())
