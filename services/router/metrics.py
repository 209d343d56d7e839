"""Prometheus metrics of the router (its /metrics): what happened, by event, and each shard's state."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from pagedserve.services.router.core import RouterCore

# Per shard, as Placement.view() has it: pagedserve_router_shard_<key>{shard="i"}.
_PER_SHARD = {
    "alive": "1 while the shard answers",
    "requests": "requests placed there and not ended",
    "tokens": "outstanding tokens placed there (prompt + max_tokens x n)",
    "seen_blocks": "prompt blocks placed there that the router remembers",
}


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.events = Counter(
            "pagedserve_router_events", "placements by reason, locates, shard losses", ["event"], registry=r
        )
        self.relayed = Counter("pagedserve_router_frames", "frames relayed", ["direction"], registry=r)
        self.per_shard = {
            key: Gauge(f"pagedserve_router_shard_{key}", text, ["shard"], registry=r)
            for key, text in _PER_SHARD.items()
        }
        self._counted: dict[str, int] = {}  # the core's counts already added to `events`

    def sync(self, core: RouterCore) -> None:
        """Run on the ops server's thread while the loop counts on: a copy, so a new event's key
        cannot change the dict under the iteration."""
        for event, count in dict(core.counts).items():
            new = count - self._counted.get(event, 0)
            if new:
                self.events.labels(event).inc(new)
                self._counted[event] = count
        for entry in core.placement.view():
            for key, gauge in self.per_shard.items():
                gauge.labels(str(entry["shard"])).set(float(entry[key]))
