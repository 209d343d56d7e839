"""The block-manager process: the core behind a ROUTER socket, a reaper timer and the ops endpoint.

    worker    --register / heartbeat {pool_id, incarnation, num_blocks, block_size}-->  (pool kept fresh)
    scheduler --block_ops {seq, ops}-->  block_reply {seq, results, free_blocks, instance}
    scheduler --renew_owner {owner}-->   (every live lease of that scheduler pushed out)
    scheduler --pools {seq}-->           pools_reply {seq, pools: {id: [num_blocks, block_size, incarnation]}}

Heartbeats carry the registration, so a restarted block manager learns every pool again within one
heartbeat, and a restarted worker (new incarnation) gets a fresh pool. `instance` changes on every
start: a scheduler that sees it change knows every table it held is gone.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import zmq
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from pagedserve.services.block_manager import pool_view
from pagedserve.services.block_manager.manager import BlockManager
from pagedserve.shared import ops_page
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.log import configure_logging, on_stop_signals
from pagedserve.shared.ops_history import History
from pagedserve.shared.ops_server import OpsServer, json_response
from pagedserve.shared.pauses import AwakeSince
from pagedserve.shared.protocol.blocks import BlockBatch, BlockReply
from pagedserve.shared.protocol.codec import ProtocolError
from pagedserve.shared.protocol.control import (
    Heartbeat,
    PoolInfo,
    Pools,
    PoolsReply,
    Register,
    Registered,
    RenewOwner,
    WorkerAnnouncement,
)
from pagedserve.shared.protocol.frontend import Error
from pagedserve.shared.protocol.messages import message_table, read_message
from pagedserve.shared.transport import (
    CurveKeys,
    RouterFrameError,
    make_socket,
    recv_router,
    send,
    start_authenticator,
)

# What the block manager takes: schedulers' batches and probes, workers' registrations.
_RECEIVES = message_table(BlockBatch, Register, Heartbeat, RenewOwner, Pools)
_POLL_S = 0.1  # the loop's poll wait: frames wake it, so this only paces the timers


class BlockManagerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.blocks = Gauge("pagedserve_bm_blocks", "KV blocks by state", ["state"], registry=r)
        self.kv_usage = Gauge("pagedserve_bm_kv_usage_ratio", "used / total blocks", registry=r)
        self.leases = Gauge("pagedserve_bm_leases", "live leases", registry=r)
        self.pools = Gauge("pagedserve_bm_pools", "registered worker pools", registry=r)
        self.reclaimed_blocks = Counter(
            "pagedserve_bm_reclaimed_blocks", "blocks taken back", ["reason"], registry=r
        )
        self.reclaimed_requests = Counter(
            "pagedserve_bm_reclaimed_requests", "tables taken back", ["reason"], registry=r
        )
        self.bad_frames = Counter(
            "pagedserve_bm_bad_frames", "frames that did not decode", ["code"], registry=r
        )
        self.batches = Counter("pagedserve_bm_batches", "block-op batches applied", registry=r)
        self.violations = Gauge(
            "pagedserve_bm_invariant_violations", "invariants broken at the last scrape", registry=r
        )

    def observe(self, snap: dict[str, Any]) -> None:
        totals = snap["totals"]
        for state in ("free", "used", "cached", "leaked"):
            self.blocks.labels(state).set(totals[state])
        self.kv_usage.set(totals["used"] / totals["total"] if totals["total"] else 0.0)
        self.leases.set(len(snap["leases"]))
        self.pools.set(len(snap["pools"]))
        self.violations.set(len(snap["invariants"]["violations"]))


class BlockManagerService:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.log = configure_logging("block-manager", config.log_format, config.log_level)
        self.core = BlockManager(config.lease_ttl_s, config.enable_prefix_caching)
        self.lock = threading.Lock()  # the ops thread reads the core while the loop changes it
        self.instance = uuid.uuid4().hex
        self.incarnations: dict[str, str] = {}
        # Per pool: the epoch of its shared-memory segment ("" for a private pool), and whether the
        # current incarnation's registration continued it (its Registered reply says so).
        self.epochs: dict[str, str] = {}
        self.continued: dict[str, bool] = {}
        self.last_heartbeat: dict[str, float] = {}
        self.awake = AwakeSince()  # our own pauses: no worker is silent for longer than we ran
        self.metrics = BlockManagerMetrics()
        # The live view: occupancy once a second, and the pool encoding shared by every viewer.
        self.history = History(("used", "total", "cached", "leases"))
        self.view_cache: tuple[float, bytes] = (float("-inf"), b"")
        self.view_lock = threading.Lock()  # one encoding at a time, however many pages poll
        self.ctx = zmq.Context()
        keys = CurveKeys(Path(config.curve_keys_dir)) if config.curve_keys_dir else None
        self.auth = start_authenticator(self.ctx, keys) if keys else None
        self.sock = make_socket(
            self.ctx, zmq.ROUTER, max_message_bytes=config.max_message_bytes, curve_server=keys
        )
        self.sock.bind(config.block_manager_endpoint)
        self.ops: OpsServer | None = None
        if config.block_manager_ops_port:
            self.ops = OpsServer(
                config.ops_host,
                config.block_manager_ops_port,
                {
                    "/healthz": lambda: json_response({"ok": True, "instance": self.instance}),
                    "/blocks": lambda: json_response(self.snapshot()),
                    "/metrics": self._metrics_text,
                },
                {"/admin/reap": lambda: json_response({"reclaimed": self.reap(time.monotonic())})},
                admin_token=config.admin_token,
                view={
                    "/view": lambda q: ops_page.render("block-manager"),
                    "/view/pool": lambda q: (200, "application/json", self.pool_view()),
                    "/view/block": self._block_detail,
                    "/view/request": self._request_blocks,
                },
            ).start()
        self.stopping = False

    # ------------------------------------------------------------------ ops

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            snap = self.core.snapshot(time.monotonic())
        snap["instance"] = self.instance
        return snap

    def pool_view(self) -> bytes:
        """The pool's compact encoding and the occupancy history, at most once per VIEW_MAX_AGE_S (0.9 s):
        the cost of the view is bounded by the clock, not by how many pages are open."""
        with self.view_lock:
            made_at, body = self.view_cache
            now = time.monotonic()
            if now - made_at < ops_page.VIEW_MAX_AGE_S:
                return body
            started = time.perf_counter()
            with self.lock:  # only the copy into lists holds up the block ops
                gathered = self.core.pool_view_lists(now)
            locked_s = time.perf_counter() - started
            view = pool_view.encode(gathered)
            view["encode_ms"] = round((time.perf_counter() - started) * 1e3, 2)
            view["locked_ms"] = round(locked_s * 1e3, 2)
            view["instance"] = self.instance
            view["lease_ttl_s"] = self.config.lease_ttl_s
            view["history"] = self.history.view(now)
            body = json.dumps(view).encode()
            self.view_cache = (now, body)
            return body

    def _block_detail(self, query: dict[str, str]) -> tuple[int, str, bytes]:
        try:
            pool_id, block_id = query["pool"], int(query["id"])
        except (KeyError, ValueError):
            return json_response({"error": "query needs pool=<worker id>&id=<block id (int)>"}, 400)
        with self.lock:
            detail = self.core.block_detail(pool_id, block_id, time.monotonic())
        if detail is None:
            return json_response({"error": f"no block {block_id} in pool {pool_id!r}"}, 404)
        return json_response(detail)

    def _request_blocks(self, query: dict[str, str]) -> tuple[int, str, bytes]:
        with self.lock:
            found = self.core.request_blocks(query.get("id", ""))
        if found is None:
            return json_response({"error": f"no block table for request {query.get('id')!r}"}, 404)
        return json_response(found)

    def _metrics_text(self) -> tuple[int, str, bytes]:
        self.metrics.observe(self.snapshot())
        return 200, "text/plain; version=0.0.4", generate_latest(self.metrics.registry)

    # ------------------------------------------------------------------ loop

    def serve(self) -> None:
        self.log.info(
            "block_manager_started",
            endpoint=self.config.block_manager_endpoint,
            ops_port=self.ops.port if self.ops else None,
            instance=self.instance,
        )
        next_reap = time.monotonic() + self.config.reap_interval_s
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self.stopping:
            if poller.poll(timeout=int(_POLL_S * 1000)):
                for _ in range(256):  # drain a burst, then let the timers run
                    try:
                        identity, msg = recv_router(self.sock, self.config.max_message_bytes)
                    except zmq.Again:
                        break
                    except RouterFrameError as exc:
                        code = getattr(exc.error, "code", "bad_frame")
                        self.metrics.bad_frames.labels(code).inc()
                        self.log.warning("bad_frame", code=code, error=str(exc.error))
                        send(self.sock, Error(code=code, message=str(exc.error)), to=exc.identity)
                        continue
                    self.handle(identity, msg)
            now = time.monotonic()
            self.awake.turn(now, _POLL_S)
            if self.history.due(now):
                self.sample_history(now)
            if now >= next_reap:
                next_reap = now + self.config.reap_interval_s
                self.reap(now)
                self.drop_silent_workers(now)
        self.close()

    def sample_history(self, now: float) -> None:
        with self.lock:  # O(pools): counts the pools keep anyway
            pools = self.core.pools()
            total = sum(nb for nb, _ in pools.values())
            free = sum(self.core.free_blocks().values())
            cached = self.core.num_cached_blocks()
            leases = self.core.num_requests()
        self.history.add(now, total - free, total, cached, leases)

    def handle(self, identity: bytes, frame: dict[str, Any]) -> None:
        now = time.monotonic()
        try:
            msg = read_message(frame, _RECEIVES)
        except ProtocolError as exc:
            self.metrics.bad_frames.labels(exc.code).inc()
            self.log.warning("bad_message", type=frame.get("type"), code=exc.code, error=exc.message)
            send(self.sock, Error(code=exc.code, message=exc.message), to=identity)
            return
        if isinstance(msg, BlockBatch):
            with self.lock:
                reply = self.core.apply(msg.ops, now)
            self.metrics.batches.inc()
            send(
                self.sock,
                BlockReply(msg.seq, reply.results, reply.free_blocks, self.instance),
                to=identity,
            )
        elif isinstance(msg, WorkerAnnouncement):
            self.register(msg, now)
            if isinstance(msg, Register):
                continued = self.continued.get(msg.pool_id, False)
                send(self.sock, Registered(msg.pool_id, self.instance, continued), to=identity)
        elif isinstance(msg, RenewOwner):
            with self.lock:
                self.core.renew_owner(msg.owner, now)
        else:
            with self.lock:
                pools = {
                    pid: PoolInfo(nb, bs, self.incarnations.get(pid, ""))
                    for pid, (nb, bs) in self.core.pools().items()
                }
            send(self.sock, PoolsReply(msg.seq, pools, self.instance), to=identity)

    def register(self, msg: WorkerAnnouncement, now: float) -> None:
        """A new incarnation of a pool's worker: its pool continues (tables and prefix cache kept) when
        it maps the same shared-memory segment we know (same epoch, same size); else the KV those
        tables point at is gone and they are dropped."""
        pool_id, incarnation = msg.pool_id, msg.incarnation
        num_blocks, block_size = msg.num_blocks, msg.block_size
        self.last_heartbeat[pool_id] = now
        if self.incarnations.get(pool_id) == incarnation:
            return
        with self.lock:
            continued = (
                msg.pool_epoch != ""
                and self.epochs.get(pool_id) == msg.pool_epoch
                and self.core.pools().get(pool_id) == (num_blocks, block_size)
            )
            if continued:
                kept, dropped = self.core.requests_of(pool_id), []
            else:
                kept = []
                dropped = self.core.remove_pool(pool_id) if self.core.has_pool(pool_id) else []
                self.core.add_pool(pool_id, num_blocks, block_size)
        self.incarnations[pool_id] = incarnation
        self.epochs[pool_id] = msg.pool_epoch
        self.continued[pool_id] = continued
        self.log.info(
            "pool_continued" if continued else "pool_registered",
            worker_id=pool_id,
            incarnation=incarnation,
            num_blocks=num_blocks,
            block_size=block_size,
            pool_epoch=msg.pool_epoch,
            kept_requests=len(kept),
            dropped_requests=len(dropped),
        )

    def reap(self, now: float) -> int:
        with self.lock:
            reclaimed = self.core.reap_expired(now)
        for r in reclaimed:
            self.metrics.reclaimed_blocks.labels("lease_expired").inc(r.num_blocks)
            self.metrics.reclaimed_requests.labels("lease_expired").inc()
            self.log.warning(
                "lease_expired_blocks_reclaimed",
                request_id=r.request_id,
                owner=r.owner,
                worker_id=r.pool_id,
                num_blocks=r.num_blocks,
            )
        return len(reclaimed)

    def drop_silent_workers(self, now: float) -> None:
        for pool_id, seen in list(self.last_heartbeat.items()):
            # A pool in shared memory outlives its worker: its tables wait for the worker's restart
            # as long as the scheduler holds its requests for it (then a while more, so that the
            # scheduler gives up first and frees them itself).
            grace = self.config.worker_timeout_s
            if self.epochs.get(pool_id):
                grace += self.config.kv_resume_timeout_s
            if self.awake.silence(now, seen) <= grace:
                continue
            with self.lock:
                free_before = self.core.num_free_blocks(pool_id) if self.core.has_pool(pool_id) else 0
                total = self.core.pools().get(pool_id, (0, 0))[0]
                dropped = self.core.remove_pool(pool_id) if self.core.has_pool(pool_id) else []
            del self.last_heartbeat[pool_id]
            self.incarnations.pop(pool_id, None)
            self.epochs.pop(pool_id, None)
            self.continued.pop(pool_id, None)
            self.metrics.reclaimed_blocks.labels("worker_lost").inc(total - free_before)
            self.metrics.reclaimed_requests.labels("worker_lost").inc(len(dropped))
            self.log.warning(
                "worker_lost_pool_dropped",
                worker_id=pool_id,
                silent_s=round(now - seen, 2),
                dropped_requests=len(dropped),
            )

    def close(self) -> None:
        if self.ops:
            self.ops.stop()
        if self.auth:
            self.auth.stop()
        self.sock.close(0)
        self.ctx.term()


def run(config: ServeConfig) -> None:
    service = BlockManagerService(config)
    on_stop_signals(lambda: setattr(service, "stopping", True))
    service.serve()
