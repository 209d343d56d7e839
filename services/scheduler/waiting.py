"""The waiting queue: explicit priority, tenants in turn within a priority, aging against starvation.

A request's effective priority is `priority + floor(waited / aging_s)`: every `aging_s` spent
waiting lifts it one level, so an old request overtakes newer ones of its level and, in time,
newer ones of higher levels too. Ties go to the earlier arrival.

Within a level, tenants (a request's user, else its client connection) take turns: each keeps its
own FIFO, and after a tenant's request is taken the next tenant's oldest is next. A tenant new to
the level goes before those already served. One user who queues 500 requests therefore delays
another user's newly arrived request by one admission at most, not by 500. With one tenant (the
in-process engine) this is plain FCFS.

Cost: one FIFO per (priority, tenant); a pick compares only each level's next head, so a pick costs
O(levels), never O(queue length) or O(tenants).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

from pagedserve.services.scheduler.request import Request


class _Level:
    """One priority: tenant -> FIFO. Tenants not served since they joined go first, in the order
    they came (a newcomer does not wait out a round of those already served); then the served ones,
    in turn order."""

    __slots__ = ("fresh", "served", "size")

    def __init__(self) -> None:
        self.fresh: OrderedDict[str, deque[Request]] = OrderedDict()
        self.served: OrderedDict[str, deque[Request]] = OrderedDict()
        self.size = 0

    def _next(self) -> OrderedDict[str, deque[Request]]:
        return self.fresh if self.fresh else self.served

    def _fifo(self, tenant: str) -> deque[Request] | None:
        fifo = self.fresh.get(tenant)
        return fifo if fifo is not None else self.served.get(tenant)

    def head(self) -> Request:
        return next(iter(self._next().values()))[0]

    def push(self, request: Request) -> None:
        fifo = self._fifo(request.tenant)
        if fifo is None:
            fifo = self.fresh[request.tenant] = deque()
        fifo.append(request)
        self.size += 1

    def push_front(self, request: Request) -> None:
        # A preempted request goes first: its tenant moves to the very front.
        fifo = self.served.pop(request.tenant, None) or self.fresh.pop(request.tenant, deque())
        fifo.appendleft(request)
        self.fresh[request.tenant] = fifo
        self.fresh.move_to_end(request.tenant, last=False)
        self.size += 1

    def pop_head(self) -> Request:
        turns = self._next()
        tenant, fifo = next(iter(turns.items()))
        request = fifo.popleft()
        del turns[tenant]
        if fifo:
            self.served[tenant] = fifo  # its turn is over: to the back
        self.size -= 1
        return request

    def remove(self, request: Request) -> bool:
        fifo = self._fifo(request.tenant)
        if fifo is None or request not in fifo:
            return False
        fifo.remove(request)
        if not fifo:
            del (self.fresh if request.tenant in self.fresh else self.served)[request.tenant]
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
            for turns in (level.fresh, level.served):
                for fifo in turns.values():
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
