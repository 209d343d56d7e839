"""One HTTP request's SDK requests (one per prompt, each with its n completions), run together.

Whatever ends early (an error in one prompt, a client that hung up, a cancelled task) aborts the
others through the SDK: a cancelled `generate` or stream abandons its request, which sends Abort.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from pagedserve.services.api.sampling import Prompt
from pagedserve.shared.protocol.frontend import SamplingParams
from pagedserve.shared.sdk import AsyncClient, AsyncStream, Result, StreamDelta

Event = tuple[int, StreamDelta | Result]  # (prompt index, what arrived)


def scheduler_ids(response_id: str, count: int) -> list[str]:
    """Unique per attempt even when a client reuses its X-Request-Id: a reused scheduler id would be
    answered with the stored result of the earlier request."""
    salt = uuid.uuid4().hex[:8]
    return [f"{response_id}.{salt}.{i}" for i in range(count)]


def _first_error(group: BaseExceptionGroup) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group.exceptions[0]


async def generate_all(
    client: AsyncClient,
    prompts: list[Prompt],
    sampling: SamplingParams,
    response_id: str,
    user: str | None = None,
    lora: str | None = None,
) -> list[Result]:
    """Every prompt to the end, in prompt order; the first failure cancels (aborts) the rest."""
    ids = scheduler_ids(response_id, len(prompts))
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(
                    client.generate(
                        prompt=p.text,
                        prompt_token_ids=p.token_ids,
                        request_id=rid,
                        sampling_params=sampling,
                        user=user,
                        lora=lora,
                    )
                )
                for p, rid in zip(prompts, ids, strict=True)
            ]
    except BaseExceptionGroup as group_error:
        raise _first_error(group_error) from None
    return [t.result() for t in tasks]


class Fanout:
    """The streams of one HTTP request merged into one feed of (prompt index, event)."""

    def __init__(self) -> None:
        # None: closed (a hang-up or an error); the reader of events() stops there.
        self._queue: asyncio.Queue[tuple[int, StreamDelta | Result | BaseException | None]] = asyncio.Queue()
        self._pumps: list[asyncio.Task[None]] = []
        self._streams: list[AsyncStream] = []

    @classmethod
    async def open(
        cls,
        client: AsyncClient,
        prompts: list[Prompt],
        sampling: SamplingParams,
        response_id: str,
        user: str | None = None,
        lora: str | None = None,
    ) -> Fanout:
        """Submit every prompt now; a refusal at submit time aborts those already sent."""
        fanout = cls()
        try:
            for p, rid in zip(prompts, scheduler_ids(response_id, len(prompts)), strict=True):
                fanout._streams.append(
                    client.stream(
                        prompt=p.text,
                        prompt_token_ids=p.token_ids,
                        request_id=rid,
                        sampling_params=sampling,
                        user=user,
                        lora=lora,
                    )
                )
        except BaseException:
            await fanout.close()
            raise
        fanout._pumps = [asyncio.create_task(fanout._pump(i, s)) for i, s in enumerate(fanout._streams)]
        return fanout

    async def _pump(self, index: int, stream: AsyncStream) -> None:
        try:
            async for delta in stream:
                self._queue.put_nowait((index, delta))
            assert stream.result is not None
            self._queue.put_nowait((index, stream.result))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the reader of events(), which raises it
            self._queue.put_nowait((index, exc))

    async def events(self) -> AsyncIterator[Event]:
        """Deltas as they come, then each prompt's Result; a failure raises (and aborts the rest)."""
        remaining = len(self._streams)
        try:
            while remaining:
                index, item = await self._queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Result):
                    remaining -= 1
                yield index, item
        finally:
            await self.close()

    async def close(self) -> None:
        """Abort every stream that has not finished (a no-op for those that have)."""
        self._queue.put_nowait((-1, None))
        for pump in self._pumps:
            pump.cancel()
        for stream in self._streams:
            await stream.aclose()  # a pump that never ran never abandoned its stream: do it here
