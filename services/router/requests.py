"""The router's soft state: which shard holds each live request it relayed, and the requests whose
shard it is still asking for.

All of it may be lost (a router restart): clients re-submit with attach=True on reconnect, and the
router then asks every shard which one holds the id (`Locate`) before relaying.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.shared.transport import Route


@dataclass(slots=True)
class Placed:
    """A request relayed to `shard`. `frame` is the client's submit as sent, kept so that the request can
    be placed again if its shard is lost (the new shard starts it over; the client keeps by offset)."""

    client: Route
    shard: int
    frame: bytes
    blocks: list[int]
    cost: int


@dataclass(slots=True)
class Locating:
    """A frame waiting to learn which shard holds its request: the shards not yet answered, and what to
    do when every one says "unknown" (a submit is placed as new; an abort is refused)."""

    client: Route
    frame: bytes
    kind: str
    waiting: set[int]
    deadline: float
    blocks: list[int] = field(default_factory=list)
    cost: int = 0


@dataclass(slots=True)
class RouterBook:
    placed: dict[str, Placed] = field(default_factory=dict)
    locating: dict[str, Locating] = field(default_factory=dict)
    by_client: dict[Route, set[str]] = field(default_factory=dict)

    def place(self, request_id: str, placed: Placed) -> None:
        self.placed[request_id] = placed
        self.by_client.setdefault(placed.client, set()).add(request_id)

    def reroute(self, request_id: str, client: Route) -> None:
        """The client reconnected (a new route): replies and pings follow it, the old route lets go."""
        placed = self.placed[request_id]
        self._forget(placed.client, request_id)
        placed.client = client
        self.by_client.setdefault(client, set()).add(request_id)

    def end(self, request_id: str) -> Placed | None:
        placed = self.placed.pop(request_id, None)
        if placed is not None:
            self._forget(placed.client, request_id)
        return placed

    def _forget(self, client: Route, request_id: str) -> None:
        ids = self.by_client.get(client)
        if ids is not None:
            ids.discard(request_id)
            if not ids:
                del self.by_client[client]

    def shards_of(self, client: Route) -> set[int]:
        """The shards holding the client's live requests: where its pings must go on."""
        return {self.placed[rid].shard for rid in self.by_client.get(client, ()) if rid in self.placed}

    def on_shard(self, shard: int) -> list[str]:
        return [rid for rid, p in self.placed.items() if p.shard == shard]

    def lapsed_locates(self, now: float) -> list[str]:
        return [rid for rid, loc in self.locating.items() if now >= loc.deadline]
