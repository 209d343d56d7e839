"""The waiting queue: explicit priority, tenants in turn within a priority, aging against starvation.

A request's effective priority is `priority + floor(waited / aging_s)`: every `aging_s` spent
waiting lifts it one level, so an old request overtakes newer ones of its level and, in time,
newer ones of higher levels too. Ties go to the earlier arrival.

Within a level, tenants (a request's user, else its client connection) take turns: each keeps its
own FIFO, and after a tenant's request is taken the next tenant's oldest is next. One user who
queues 500 requests therefore delays another user's one request by at most one admission per
tenant, not by 500. With one tenant (the in-process engine) this is plain FCFS.

Cost: one FIFO per (priority, tenant); a pick compares only each level's next head, so a pick costs
O(levels), never O(queue length) or O(tenants).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

from pagedserve.services.scheduler.request import Request


class _Level:
    """One priority: tenant -> FIFO, in turn order (the first key goes next)."""

    __slots__ = ("tenants", "size")

    def __init__(self) -> None:
        self.tenants: OrderedDict[str, deque[Request]] = OrderedDict()
        self.size = 0

    def head(self) -> Request:
        return next(iter(self.tenants.values()))[0]

    def push(self, request: Request) -> None:
        self.tenants.setdefault(request.tenant, deque()).append(request)
        self.size += 1

    def push_front(self, request: Request) -> None:
        self.tenants.setdefault(request.tenant, deque()).appendleft(request)
        self.tenants.move_to_end(request.tenant, last=False)
        self.size += 1

    def pop_head(self) -> Request:
        tenant, fifo = next(iter(self.tenants.items()))
        request = fifo.popleft()
        if fifo:
            self.tenants.move_to_end(tenant)  # its turn is over
        else:
            del self.tenants[tenant]
        self.size -= 1
        return request

    def remove(self, request: Request) -> bool:
        fifo = self.tenants.get(request.tenant)
        if fifo is None or request not in fifo:
            return False
        fifo.remove(request)
        if not fifo:
            del self.tenants[request.tenant]
        self.size -= 1
        return True


class WaitingQueue:
    def __init__(self, aging_s: float) -> None:
        self.aging_s = aging_s
        self._levels: dict[int, _Level] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self):
        for level in self._levels.values():
            for fifo in level.tenants.values():
                yield from fifo

    def push(self, request: Request) -> None:
        self._levels.setdefault(request.sampling.priority, _Level()).push(request)
        self._size += 1

    def push_front(self, request: Request) -> None:
        """A preempted request returns ahead of its level: it arrived before everyone there."""
        self._levels.setdefault(request.sampling.priority, _Level()).push_front(request)
        self._size += 1

    def effective_priority(self, request: Request, now: float) -> float:
        if self.aging_s <= 0:
            return math.inf
        return request.sampling.priority + math.floor(max(0.0, now - request.arrival) / self.aging_s)

    def peek(self, now: float) -> Request | None:
        best: Request | None = None
        best_key: tuple[float, float] | None = None
        for level in self._levels.values():
            head = level.head()
            key = (self.effective_priority(head, now), -head.arrival)
            if best_key is None or key > best_key:
                best, best_key = head, key
        return best

    def pop(self, request: Request) -> None:
        """Remove `request`, which must be the head of its level (as returned by peek)."""
        level = self._levels[request.sampling.priority]
        head = level.pop_head()
        assert head is request, "pop() takes the request peek() returned"
        self._size -= 1
        if not level.size:
            del self._levels[request.sampling.priority]

    def remove(self, request: Request) -> bool:
        """Abort or deadline: O(the tenant's queue length), off the hot path."""
        level = self._levels.get(request.sampling.priority)
        if level is None or not level.remove(request):
            return False
        self._size -= 1
        if not level.size:
            del self._levels[request.sampling.priority]
        return True
