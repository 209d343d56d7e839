"""A ring of 1 Hz samples for the live view's timeline: the last ten minutes, O(1) per sample.

Each service samples what it alone knows (the block manager its occupancy, the scheduler its
queue and step times) from its own loop; the ops thread only copies the ring.
"""

from __future__ import annotations

from collections import deque
from typing import Any

HISTORY_S = 600


class History:
    def __init__(self, fields: tuple[str, ...], interval_s: float = 1.0, keep_s: float = HISTORY_S) -> None:
        self.fields = fields
        self.interval_s = interval_s
        self._rows: deque[tuple[float, ...]] = deque(maxlen=int(keep_s / interval_s))
        self._next_at = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next_at

    def add(self, now: float, *values: float) -> None:
        """One sample (values in the order of `fields`); the next one is due an interval later."""
        self._next_at = now + self.interval_s
        self._rows.append((now, *values))

    def view(self, now: float) -> dict[str, Any]:
        """Columns, times as seconds before `now` (negative): what the page plots."""
        rows = list(self._rows)  # a copy: the loop appends while the ops thread reads
        out: dict[str, Any] = {"t": [round(r[0] - now, 2) for r in rows]}
        for i, name in enumerate(self.fields, start=1):
            out[name] = [r[i] for r in rows]
        return out
