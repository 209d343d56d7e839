"""The router process: one front ROUTER for clients, one DEALER per shard, the core's decisions between.

    clients --frames--> front ROUTER --[client, frame]--> DEALER per shard --> each scheduler's front
    clients <--frames-- front ROUTER <--[client, frame]-- DEALER per shard <-- each scheduler's front

Every frame is decoded once here (the core reads its type and request id) and relayed as it came.
A shard's dropped connection counts as its loss at once (a restarted scheduler forgot its requests);
silence longer than router_shard_timeout_s does too.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import zmq
from prometheus_client import generate_latest
from zmq.utils.monitor import recv_monitor_message

from pagedserve.services.router import lora_admin
from pagedserve.services.router.core import RouterCore, Send
from pagedserve.services.router.metrics import RouterMetrics
from pagedserve.services.router.placement import Placement
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.config_sections import RouterSection
from pagedserve.shared.log import configure_logging, on_stop_signals
from pagedserve.shared.ops_server import OpsServer, json_response
from pagedserve.shared.protocol.codec import ProtocolError, decode
from pagedserve.shared.protocol.frontend import Error
from pagedserve.shared.transport import (
    CurveKeys,
    make_socket,
    send,
    start_authenticator,
)

_POLL_S = 0.01
_BATCH = 512
_LOCATE_TIMEOUT_S = 2.0


class RouterService:
    def __init__(self, config: ServeConfig) -> None:
        router = config.section(RouterSection)
        if not router.router_shards:
            raise ValueError("router_shards: give the front endpoint of at least one scheduler")
        if router.router_shard_ops and len(router.router_shard_ops) != len(router.router_shards):
            raise ValueError(
                f"router_shard_ops: {len(router.router_shard_ops)} URLs for {len(router.router_shards)} shards"
            )
        self.config = config
        self.log = configure_logging("router", config.log_format, config.log_level)
        placement = Placement.of(router)
        self.core = RouterCore(
            placement,
            config.block_size,
            config.heartbeat_interval_s,
            config.router_shard_timeout_s,
            _LOCATE_TIMEOUT_S,
        )
        self.metrics = RouterMetrics()
        self.ctx = zmq.Context()
        keys = CurveKeys(Path(config.curve_keys_dir)) if config.curve_keys_dir else None
        self.auth = start_authenticator(self.ctx, keys) if keys else None
        mk = config.max_message_bytes
        self.front = make_socket(self.ctx, zmq.ROUTER, max_message_bytes=mk, curve_server=keys)
        self.front.bind(config.front_endpoint)
        self.shards: list[zmq.Socket] = []
        self.monitors: list[zmq.Socket] = []
        for endpoint in config.router_shards:
            sock = make_socket(self.ctx, zmq.DEALER, max_message_bytes=mk, curve_client=keys)
            sock.setsockopt(zmq.SNDHWM, 0)  # a shard's queue holds its submits while it restarts
            self.monitors.append(sock.get_monitor_socket(zmq.EVENT_DISCONNECTED))
            sock.connect(endpoint)
            self.shards.append(sock)
        self.stopping = False
        self.ops: OpsServer | None = None
        if config.router_ops_port:
            self.ops = OpsServer(
                config.ops_host,
                config.router_ops_port,
                {
                    "/healthz": lambda: json_response({"ok": True}),
                    "/readyz": self._readyz,
                    "/shards": lambda: json_response({"shards": self._shards_view()}),
                    "/metrics": self._metrics,
                    **(
                        {"/loras": lambda: lora_admin.listing(config.router_shard_ops, config.admin_token)}
                        if config.router_shard_ops
                        else {}
                    ),
                },
                admin_token=config.admin_token,
                post_json=self._lora_routes(),
            ).start()

    def _lora_routes(self) -> dict[str, Any]:
        """The API's LoRA admin, made on every shard (lora_admin.py); none without the shards' ops URLs."""
        shards, token = self.config.router_shard_ops, self.config.admin_token
        if not shards:
            return {}
        return {
            f"/loras/{action}": (
                lambda body, action=action: lora_admin.everywhere(shards, action, body, token)
            )
            for action in ("load", "unload")
        }

    def _shards_view(self) -> list[dict[str, Any]]:
        view = self.core.placement.view()
        for entry, endpoint in zip(view, self.config.router_shards, strict=True):
            entry["endpoint"] = endpoint
        return view

    def _readyz(self) -> tuple[int, str, bytes]:
        alive = self.core.placement.alive()
        return json_response({"ready": bool(alive), "shards_alive": alive}, 200 if alive else 503)

    def _metrics(self) -> tuple[int, str, bytes]:
        self.metrics.sync(self.core)
        return 200, "text/plain; version=0.0.4", generate_latest(self.metrics.registry)

    # ------------------------------------------------------------------ loop

    def serve(self) -> None:
        self.log.info(
            "router_started",
            front=self.config.front_endpoint,
            shards=self.config.router_shards,
            policy=self.config.router_policy,
            ops_port=self.ops.port if self.ops else None,
        )
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        for sock in (*self.shards, *self.monitors):
            poller.register(sock, zmq.POLLIN)
        while not self.stopping:
            ready = dict(poller.poll(timeout=int(_POLL_S * 1000)))
            if self.front in ready:
                self._drain_front()
            for shard, sock in enumerate(self.shards):
                if sock in ready:
                    self._drain_shard(shard, sock)
            for shard, monitor in enumerate(self.monitors):
                if monitor in ready and _dropped(monitor):
                    self.log.warning(
                        "shard_disconnected", shard=shard, endpoint=self.config.router_shards[shard]
                    )
                    self._out(self.core.shard_lost(shard, "disconnected"))
            self._out(self.core.tick(time.monotonic()))
        self.close()

    def _drain_front(self) -> None:
        for _ in range(_BATCH):
            try:
                parts = self.front.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            client, frame = tuple(parts[:-1]), parts[-1]
            try:
                msg = decode(frame, self.config.max_message_bytes)
                if len(client) != 1:
                    raise ProtocolError("bad_frame", f"expected one frame, got {len(parts) - 1}")
            except ProtocolError as exc:
                self.log.warning("bad_frame", code=exc.code, error=exc.message)
                send(self.front, Error(code=exc.code, message=exc.message), to=client[:1])
                continue
            self.metrics.relayed.labels("in").inc()
            self._out(self.core.on_client(client, msg, frame, time.monotonic()))

    def _drain_shard(self, shard: int, sock: zmq.Socket) -> None:
        for _ in range(_BATCH):
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            route, frame = tuple(parts[:-1]), parts[-1]
            try:
                msg = decode(frame)
            except ProtocolError as exc:  # a scheduler's bug: drop the frame, say so
                self.log.warning("bad_shard_frame", shard=shard, error=exc.message)
                continue
            self.metrics.relayed.labels("out").inc()
            self._out(self.core.on_shard(shard, route, msg, frame, time.monotonic()))

    def _out(self, sends: list[Send]) -> None:
        for s in sends:
            sock = self.front if s.shard is None else self.shards[s.shard]
            # A full queue: a client gone or hopelessly behind; its own timeouts handle it.
            with contextlib.suppress(zmq.Again):
                sock.send_multipart([*s.route, s.frame], zmq.NOBLOCK)

    def close(self) -> None:
        if self.ops is not None:
            self.ops.stop()
        for sock in (self.front, *self.shards, *self.monitors):
            sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


def _dropped(monitor: zmq.Socket) -> bool:
    dropped = False
    while True:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)
        except zmq.Again:
            return dropped
        dropped |= event["event"] == zmq.EVENT_DISCONNECTED


def run(config: ServeConfig) -> None:
    service = RouterService(config)
    on_stop_signals(lambda: setattr(service, "stopping", True))
    service.serve()
