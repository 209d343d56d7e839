"""The waiting queue: explicit priority, FCFS within a priority, aging against starvation.

A request's effective priority is `priority + floor(waited / aging_s)`: every `aging_s` spent
waiting lifts it one level, so an old request overtakes newer ones of its level and, in time,
newer ones of higher levels too. Ties go to the earlier arrival.

Cost: one FIFO per priority level; a pick compares only the heads (the oldest of each level is
always its best), so a pick costs O(levels), never O(queue length).
"""

from __future__ import annotations

import math
from collections import deque

from pagedserve.services.scheduler.request import Request


class WaitingQueue:
    def __init__(self, aging_s: float) -> None:
        self.aging_s = aging_s
        self._levels: dict[int, deque[Request]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self):
        for level in self._levels.values():
            yield from level

    def push(self, request: Request) -> None:
        self._levels.setdefault(request.sampling.priority, deque()).append(request)
        self._size += 1

    def push_front(self, request: Request) -> None:
        """A preempted request returns ahead of its level: it arrived before everyone there."""
        self._levels.setdefault(request.sampling.priority, deque()).appendleft(request)
        self._size += 1

    def effective_priority(self, request: Request, now: float) -> float:
        if self.aging_s <= 0:
            return math.inf
        return request.sampling.priority + math.floor(max(0.0, now - request.arrival) / self.aging_s)

    def peek(self, now: float) -> Request | None:
        best: Request | None = None
        best_key: tuple[float, float] | None = None
        for level in self._levels.values():
            if not level:
                continue
            head = level[0]
            key = (self.effective_priority(head, now), -head.arrival)
            if best_key is None or key > best_key:
                best, best_key = head, key
        return best

    def pop(self, request: Request) -> None:
        """Remove `request`, which must be the head of its level (as returned by peek)."""
        level = self._levels[request.sampling.priority]
        head = level.popleft()
        assert head is request, "pop() takes the request peek() returned"
        self._size -= 1
        if not level:
            del self._levels[request.sampling.priority]

    def remove(self, request: Request) -> bool:
        """Abort or deadline: O(level length), off the hot path."""
        level = self._levels.get(request.sampling.priority)
        if level is None or request not in level:
            return False
        level.remove(request)
        self._size -= 1
        if not level:
            del self._levels[request.sampling.priority]
        return True
