"""The per-client book: who asked for what, whether they stream, when each client was last heard;
and the results of finished requests, so a retry by request id is a lookup, not a second run."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pagedserve.services.scheduler.admission import RequestRejected
from pagedserve.shared.protocol.frontend import Error, Finished
from pagedserve.shared.transport import Route


@dataclass(slots=True)
class ClientBook:
    """Who asked for what: routes, liveness and per-client limits."""

    max_inflight: int
    route: dict[str, Route] = field(default_factory=dict)  # request id -> the client's frames
    streaming: dict[str, bool] = field(default_factory=dict)
    live: dict[Route, set[str]] = field(default_factory=dict)  # client -> its live request ids
    last_seen: dict[Route, float] = field(default_factory=dict)
    # Requests that name a user count against that user's limit instead of their connection's:
    # several API processes (each one connection) serve one user, and one serves many users.
    by_user: dict[str, set[str]] = field(default_factory=dict)
    user_of: dict[str, str] = field(default_factory=dict)  # request id -> its user

    def seen(self, client: Route, now: float) -> None:
        self.last_seen[client] = now

    def admit(self, client: Route, request_id: str, stream: bool, user: str | None = None) -> None:
        ids = self.live.setdefault(client, set())
        counted = ids if user is None else self.by_user.setdefault(user, set())
        if len(counted) >= self.max_inflight:
            who = "this client" if user is None else f"user {user!r}"
            raise RequestRejected(
                "too_many_requests",
                f"{who} already has {len(counted)} requests in flight; "
                f"the limit is max_inflight_per_client={self.max_inflight}",
            )
        if user is not None:
            counted.add(request_id)
            self.user_of[request_id] = user
        ids.add(request_id)
        self.route[request_id] = client
        self.streaming[request_id] = stream

    def reroute(self, client: Route, request_id: str, stream: bool) -> None:
        old = self.route.get(request_id)
        if old is not None and old in self.live:
            self.live[old].discard(request_id)
        self.live.setdefault(client, set()).add(request_id)
        self.route[request_id] = client
        self.streaming[request_id] = stream

    def done(self, request_id: str) -> Route | None:
        client = self.route.pop(request_id, None)
        self.streaming.pop(request_id, None)
        user = self.user_of.pop(request_id, None)
        if user is not None:
            self.by_user[user].discard(request_id)
            if not self.by_user[user]:
                del self.by_user[user]
        if client is not None and client in self.live:
            self.live[client].discard(request_id)
            if not self.live[client]:
                del self.live[client]
        return client

    def lapsed(self, now: float, timeout_s: float) -> list[tuple[Route, list[str]]]:
        """Clients with live requests whose heartbeats stopped."""
        out = []
        for client, ids in self.live.items():
            if ids and now - self.last_seen.get(client, now) > timeout_s:
                out.append((client, sorted(ids)))
        return out


class FinishedStore:
    """Results of finished requests, so a retry by request id is a lookup, not a second run."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Finished | Error] = OrderedDict()

    def put(self, request_id: str, reply: Finished | Error) -> None:
        self._items[request_id] = reply
        self._items.move_to_end(request_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, request_id: str) -> Finished | Error | None:
        return self._items.get(request_id)
