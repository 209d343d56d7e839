"""The Responses API's store: a bounded LRU whose entries chain into conversations, and the running
responses /cancel can stop."""

from __future__ import annotations

import asyncio

import pytest

from pagedserve.services.api.errors import APIError
from pagedserve.services.api.responses.routes import _until_cancelled
from pagedserve.services.api.responses.store import ResponseStore, StoredResponse


def turn(text: str) -> list[dict]:
    return [{"type": "message", "role": "user", "content": text}]


def test_history_follows_the_chain_oldest_first():
    store = ResponseStore(limit=10)
    store.put("a", StoredResponse({"id": "a"}, turn("1"), None))
    store.put("b", StoredResponse({"id": "b"}, turn("2"), "a"))
    store.put("c", StoredResponse({"id": "c"}, turn("3"), "b"))
    assert [i["content"] for i in store.history("c")] == ["1", "2", "3"]


def test_the_least_recently_used_falls_out_and_is_a_404_naming_the_limit():
    store = ResponseStore(limit=2)
    for rid in ("a", "b"):
        store.put(rid, StoredResponse({"id": rid}, turn(rid), None))
    store.get("a")  # a is used: b is now the oldest
    store.put("c", StoredResponse({"id": "c"}, turn("c"), None))
    assert store.get("a") and store.get("c")
    with pytest.raises(APIError) as err:
        store.history("b")
    assert (
        err.value.status == 404
        and err.value.param == "previous_response_id"
        and "last 2" in err.value.message
    )


def test_a_store_of_zero_keeps_nothing():
    store = ResponseStore(limit=0)
    store.put("a", StoredResponse({"id": "a"}, turn("a"), None))
    with pytest.raises(APIError):
        store.get("a")


def test_cancel_stops_a_running_response_and_only_a_running_one():
    store = ResponseStore(limit=10)

    async def scenario() -> tuple[object, object]:
        cancelled = store.start("r", {"id": "r", "status": "in_progress"})
        never = asyncio.get_running_loop().create_future()  # work that would never end
        waiting = asyncio.ensure_future(_until_cancelled(never, cancelled))
        await asyncio.sleep(0)
        snapshot = store.cancel("r")
        result = await asyncio.wait_for(waiting, 5)
        return snapshot, (result, never.cancelled())

    snapshot, (result, work_cancelled) = asyncio.run(scenario())
    assert snapshot == {"id": "r", "status": "in_progress"}
    assert result is None and work_cancelled  # the work (its requests) was cancelled
    store.end("r")
    assert store.cancel("r") is None
