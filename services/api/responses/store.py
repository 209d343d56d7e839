"""The responses one API process keeps, for previous_response_id, GET and DELETE, and the ones running
now, for /cancel.

An in-memory LRU of at most `responses_kept` responses (ServeConfig; 1,000 by default): each entry
holds the response body and its own turn (the input items it added and its output), linked to the
response it continued, so a conversation of n turns costs n entries, not n^2 items. A response that
fell out (or was made with store=false, or by another API process: each keeps its own) is a 404
naming the limit. Nothing is written to disk: a restarted API process starts empty.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pagedserve.services.api.errors import APIError

MAX_CHAIN = 10_000  # a cycle cannot happen (ids are fresh), but a walk is bounded anyway


@dataclass(slots=True)
class StoredResponse:
    body: dict[str, Any]  # the response object as returned
    items: list[dict[str, Any]]  # this turn's input items, then its output as input items
    previous_id: str | None


class ResponseStore:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()
        # response id -> (set to cancel it, the response as it started)
        self._running: dict[str, tuple[asyncio.Event, dict[str, Any]]] = {}

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if self.limit == 0:
            return
        self._kept[response_id] = entry
        self._kept.move_to_end(response_id)
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)

    def get(self, response_id: str, field: str = "response_id") -> StoredResponse:
        entry = self._kept.get(response_id)
        if entry is None:
            raise APIError(
                404,
                f"{field}: response {response_id!r} is not stored here (this API process keeps its last "
                f"{self.limit} responses made with store=true)",
                field,
                "response_not_found",
            )
        self._kept.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._kept[response_id]

    def history(self, previous_id: str) -> list[dict[str, Any]]:
        """Every item of the conversation up to and including response `previous_id`, oldest first."""
        chain: list[StoredResponse] = []
        at: str | None = previous_id
        while at is not None and len(chain) < MAX_CHAIN:
            entry = self.get(at, "previous_response_id")
            chain.append(entry)
            at = entry.previous_id
        return [item for entry in reversed(chain) for item in entry.items]

    # ------------------------------------------------------------ running responses

    def start(self, response_id: str, started: dict[str, Any]) -> asyncio.Event:
        cancelled = asyncio.Event()
        self._running[response_id] = (cancelled, started)
        return cancelled

    def end(self, response_id: str) -> None:
        self._running.pop(response_id, None)

    def cancel(self, response_id: str) -> dict[str, Any] | None:
        """Ask a running response to stop -> the response as it started; None when none by that id runs."""
        running = self._running.get(response_id)
        if running is None:
            return None
        running[0].set()
        return running[1]
