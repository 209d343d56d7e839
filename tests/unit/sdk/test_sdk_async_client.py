"""The asyncio client against a scripted ROUTER over real TCP (each test runs its own event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pydantic
import pytest
from scripted_scheduler import ScriptedScheduler, expected_text, expected_tokens

from pagedserve.shared.sdk import AsyncClient, RequestError

pytestmark = pytest.mark.timeout(20)

FAST = {"heartbeat_s": 0.05, "reconnect_after_s": 0.3, "timeout_s": 5.0}
T = TypeVar("T")


@pytest.fixture
def server() -> Iterator[ScriptedScheduler]:
    with ScriptedScheduler() as s:
        yield s


def run_with_client(server: ScriptedScheduler, body: Callable[[AsyncClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with AsyncClient(server.endpoint, **FAST) as client:
            return await body(client)

    return asyncio.run(main())


def test_async_generate_returns_text_tokens_and_usage(server: ScriptedScheduler) -> None:
    async def body(client: AsyncClient) -> None:
        result = await client.generate("hi async", max_tokens=4)
        assert result.token_ids == expected_tokens("hi async", 4)
        assert result.usage.completion_tokens == 4

    run_with_client(server, body)


def test_async_stream_yields_deltas_in_order(server: ScriptedScheduler) -> None:
    async def body(client: AsyncClient) -> None:
        stream = client.stream("streaming", max_tokens=7)
        text = "".join([d.text async for d in stream])
        assert text == expected_text("streaming", 7)
        assert stream.result is not None and stream.result.finish_reason == "length"

    run_with_client(server, body)


def test_async_concurrent_tasks_get_their_own_results(server: ScriptedScheduler) -> None:
    async def body(client: AsyncClient) -> None:
        async def streamed(i: int) -> str:
            return "".join([d.text async for d in client.stream(f"task {i}", max_tokens=1 + i % 6)])

        async def generated(i: int) -> str:
            return (await client.generate(f"task {i}", max_tokens=1 + i % 6)).text

        texts = await asyncio.gather(*(streamed(i) if i % 2 else generated(i) for i in range(40)))
        assert texts == [expected_text(f"task {i}", 1 + i % 6) for i in range(40)]

    run_with_client(server, body)


def test_async_server_error_raises_request_error(server: ScriptedScheduler) -> None:
    async def body(client: AsyncClient) -> None:
        with pytest.raises(RequestError) as info:
            await client.generate("error:invalid_request")
        assert info.value.code == "invalid_request"
        with pytest.raises(pydantic.ValidationError):
            client.stream("x", temprature=0.5)

    run_with_client(server, body)
    assert len(server.messages("submit")) == 1


def test_async_timeout_and_abort(server: ScriptedScheduler) -> None:
    async def body(client: AsyncClient) -> None:
        with pytest.raises(RequestError, match="timeout"):
            await client.generate("hang", timeout_s=0.2)
        stream = client.stream("hang", request_id="a1")
        await client.abort("a1")
        assert [d async for d in stream] == []
        assert stream.result is not None and stream.result.finish_reason == "abort"

    run_with_client(server, body)
    assert len(server.messages("abort")) == 2


def test_async_cancelling_a_task_aborts_its_request(server: ScriptedScheduler) -> None:
    async def body(client: AsyncClient) -> None:
        task = asyncio.create_task(client.generate("hang", request_id="c1"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)

    run_with_client(server, body)
    assert [m["request_id"] for m in server.messages("abort")] == ["c1"]


def test_async_pings_flow_while_a_request_is_live(server: ScriptedScheduler) -> None:
    async def body(client: AsyncClient) -> None:
        stream = client.stream("hang")
        await asyncio.sleep(0.4)
        assert len(server.messages("ping")) >= 4
        await stream.aclose()

    run_with_client(server, body)


def test_async_close_ends_the_reader_and_fails_live_requests(server: ScriptedScheduler) -> None:
    async def main() -> None:
        client = AsyncClient(server.endpoint, **FAST)
        task = asyncio.create_task(client.generate("hang"))
        await asyncio.sleep(0.1)
        await client.close()
        with pytest.raises(RequestError, match="closed"):  # failed by close, not by its timeout
            await task
        assert client._reader is not None and client._reader.done()
        with pytest.raises(RequestError, match="closed"):
            await client.generate("too late")

    asyncio.run(main())
