"""Prometheus metrics of the HTTP API, kept by a plain ASGI middleware (not BaseHTTPMiddleware, which
wraps the receive channel that disconnect detection listens on)."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class APIMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "pagedserve_api_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "pagedserve_api_request_seconds",
            "time from the request to the end of its response (a whole stream for SSE)",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "pagedserve_api_requests_in_flight",
            "HTTP requests being answered",
            ["route"],
            registry=self.registry,
        )


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: APIMetrics, routes: set[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes  # label values are known paths only: a scan of random URLs adds no series

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self.routes else "other"
        status: dict[str, Any] = {"code": 500}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        started = time.perf_counter()
        self.metrics.in_flight.labels(route).inc()
        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.in_flight.labels(route).dec()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)
            self.metrics.requests.labels(route, str(status["code"])).inc()
