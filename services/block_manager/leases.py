"""Leases: every request's blocks are held by a lease that its owner must keep renewing.

A lease that lapses (owner crashed, an exception path that never freed, client gone) is
reclaimed by the reaper, so no failure can leak blocks for longer than one TTL.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(slots=True)
class Lease:
    owner: str
    request_id: str
    expires_at: float

    def expired(self, now: float) -> bool:
        return self.expires_at <= now


class LeaseTable:
    """Leases by request id. Renewal is a single float store (it happens on every op of a
    request, per engine step); finding the expired ones is a scan, done once per reap interval,
    which costs well under a millisecond per ten thousand live leases."""

    __slots__ = ("ttl_s", "_by_request")

    def __init__(self, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        self._by_request: dict[str, Lease] = {}

    def __len__(self) -> int:
        return len(self._by_request)

    def __iter__(self) -> Iterator[Lease]:
        return iter(self._by_request.values())

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_request

    def get(self, request_id: str) -> Lease | None:
        return self._by_request.get(request_id)

    def grant(self, owner: str, request_id: str, now: float) -> Lease:
        lease = Lease(owner, request_id, now + self.ttl_s)
        self._by_request[request_id] = lease
        return lease

    def remove(self, request_id: str) -> Lease | None:
        return self._by_request.pop(request_id, None)

    def renew_owner(self, owner: str, now: float) -> int:
        expires_at = now + self.ttl_s
        renewed = 0
        for lease in self._by_request.values():
            if lease.owner == owner:
                lease.expires_at = expires_at
                renewed += 1
        return renewed

    def expired(self, now: float) -> list[Lease]:
        """Leases due for reaping at `now`, soonest-expired first (the reaper's log reads in order)."""
        due = [lease for lease in self._by_request.values() if lease.expires_at <= now]
        due.sort(key=_expiry)
        return due


def _expiry(lease: Lease) -> float:
    return lease.expires_at
