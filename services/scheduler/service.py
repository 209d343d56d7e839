"""The scheduler process: the core between three sockets and a few timers.

    clients  --Submit/Abort/Ping-->  front ROUTER   --Accepted/Delta/Finished/Error/Pong-->
    workers  --hello/heartbeat/step_result-->  worker ROUTER  --execute/reset-->
    block manager  <--block_ops / renew_owner / pools--  DEALER (one batch per planned step that
                                                          changes blocks, its answer read like any
                                                          other frame)

The parts: frontdoor.py (the clients), liveness.py (which workers are alive), block_client.py (the
block-manager RPC, its seq / instance / lease-owner epoch). This loop wires them to the core.

Failure handling (docs/failure-model.md): a worker silent for worker_timeout_s, or with a step
unanswered past its measured step timeout (step_clock.py), is dropped and its requests recompute
elsewhere; a step overdue past its hang threshold first gets the scheduler's and the worker's stacks
dumped into their logs; a block manager that stops answering (or comes back as a new instance)
costs every table: all requests recompute once it is back, under a new lease owner so that
whatever the old one held simply expires.
"""

from __future__ import annotations

import faulthandler
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from prometheus_client import generate_latest

from pagedserve.services.checkpoint import read_checkpoint
from pagedserve.services.constraints import preload as preload_constraints
from pagedserve.services.lora_check import check_adapter
from pagedserve.services.scheduler.block_client import BlockManagerClient
from pagedserve.services.scheduler.clients import ClientBook, FinishedStore
from pagedserve.services.scheduler.frontdoor import FrontDoor
from pagedserve.services.scheduler.limits import SchedulerLimits
from pagedserve.services.scheduler.liveness import STEP_UNANSWERED, WorkerLink, WorkerLiveness
from pagedserve.services.scheduler.metrics import SchedulerMetrics
from pagedserve.services.scheduler.model_info import ModelInfo, load_model_info
from pagedserve.services.scheduler.ops_view import SchedulerWatch
from pagedserve.services.scheduler.planning import StepPlan
from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.step_clock import StepClock
from pagedserve.shared import ops_page
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.log import configure_logging, on_stop_signals
from pagedserve.shared.lora_modules import parse_lora_modules
from pagedserve.shared.ops_server import OpsServer, json_response
from pagedserve.shared.protocol.blocks import BlockAnswers, Free
from pagedserve.shared.protocol.codec import ProtocolError
from pagedserve.shared.protocol.control import DumpStacks, Heartbeat, Hello, PoolsReply, Reset
from pagedserve.shared.protocol.frontend import Error
from pagedserve.shared.protocol.messages import encode_message, message_table, read_message
from pagedserve.shared.protocol.step import ExecuteMessage, StepResult, StepResultMessage
from pagedserve.shared.transport import (
    CurveKeys,
    RouterFrameError,
    make_socket,
    recv_routed,
    recv_router,
    send,
    start_authenticator,
)

# The loop's poll wait: sockets wake it, so this only paces the timers.
_POLL_S = 0.01
# What workers send the scheduler (step socket and heartbeat socket).
_FROM_WORKERS = message_table(Heartbeat, Hello, StepResultMessage)


class SchedulerService:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.log = configure_logging("scheduler", config.log_format, config.log_level)
        self.model: ModelInfo = load_model_info(config.model, config.max_model_len, config.tokenizer)
        preload_constraints()  # the grammar engine checks constraints at submit: load it off the loop
        self.metrics = SchedulerMetrics()
        self.watch = SchedulerWatch()  # what the live view and `pagedserve top` show
        self.metrics.max_waiting.set(config.max_waiting_requests)
        self.ctx = zmq.Context()
        keys = CurveKeys(Path(config.curve_keys_dir)) if config.curve_keys_dir else None
        self.auth = start_authenticator(self.ctx, keys) if keys else None
        mk = config.max_message_bytes
        self.bm = BlockManagerClient(
            self.ctx, config.block_manager_endpoint, config.rpc_timeout_s, mk, keys, self.block_manager_lost
        )
        self.core = Scheduler(
            SchedulerLimits.from_config(config, self.model.max_model_len, self.model.rope_switch_at),
            self.model.eos_token_ids,
            self.model.tokenizer,
            owner=self.bm.owner,
        )
        self.metrics.spec_row_cost.set(self.core.speculation.row_cost)  # moves as proposals are made
        hf_config = read_checkpoint(self.model.path).config
        self.core.loras.check = lambda path: check_adapter(path, hf_config, config.max_lora_rank)
        for name, path in parse_lora_modules(config.lora_modules):
            self.core.loras.add(name, path)  # ValueError naming the entry: the scheduler does not start
        self.metrics.lora_loaded.set(len(self.core.loras.modules))
        # Generations start at random: a worker's stale result must not match a restarted scheduler's.
        self.generation = random.getrandbits(40)
        self.liveness = WorkerLiveness(
            config.heartbeat_interval_s,
            config.worker_timeout_s,
            StepClock(config.step_timeout_floor_s, config.step_timeout_factor, config.step_timeout_s),
        )
        front = make_socket(self.ctx, zmq.ROUTER, max_message_bytes=mk, curve_server=keys)
        front.bind(config.front_endpoint)
        self.front = FrontDoor(
            front,
            self.core,
            self.model,
            ClientBook(config.max_inflight_per_client),
            config.request_timeout_s,
            self.metrics,
            self.log,
            config.max_waiting_requests,
            FinishedStore(config.finished_results_kept),
            lambda: self.liveness.served_len(self.model.max_model_len),
        )
        self.workers_sock = make_socket(self.ctx, zmq.ROUTER, max_message_bytes=mk, curve_server=keys)
        # A step to a worker whose socket is gone must fail loudly, not vanish: that worker is lost.
        self.workers_sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.workers_sock.bind(config.worker_endpoint)
        # A SIGKILLed worker's TCP connection closes at once: that event shortens the heartbeat
        # timeout for a moment, so a death is noticed in well under a second, not worker_timeout_s.
        self.worker_monitor = self.workers_sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.stopping = False
        self._counted = (0, 0)  # core stats already added to the resumed / recomputed counters
        self.to_plan: set[str] = set()  # workers to consider planning for at the next pass
        self.plan_all = True  # ... or every worker
        self.ops: OpsServer | None = None
        if config.scheduler_ops_port:
            self.ops = OpsServer(
                config.ops_host,
                config.scheduler_ops_port,
                {
                    "/healthz": lambda: json_response({"ok": True}),
                    "/readyz": self._readyz,
                    "/requests": lambda: json_response(self._requests_view()),
                    "/workers": lambda: json_response({"workers": self.liveness.view(time.monotonic())}),
                    "/loras": lambda: json_response(self._loras_view()),
                    "/metrics": lambda: (
                        200,
                        "text/plain; version=0.0.4",
                        generate_latest(self.metrics.registry),
                    ),
                },
                admin_token=config.admin_token,
                post_json={"/loras/load": self._load_lora, "/loras/unload": self._unload_lora},
                view={
                    "/view": lambda q: ops_page.render("scheduler"),
                    "/view/sched": lambda q: json_response(self._watch_view()),
                    # One page shows both: the pool's routes are the block manager's, passed through.
                    **{
                        route: ops_page.forwarder(self._block_manager_ops_url(), route, config.admin_token)
                        for route in ops_page.POOL_ROUTES
                    },
                },
            ).start()

    # ------------------------------------------------------------------ ops views

    def _readyz(self) -> tuple[int, str, bytes]:
        live = self.liveness.active_ids()
        ready = bool(live) and not self.bm.down
        return json_response(
            {"ready": ready, "workers": live, "block_manager": not self.bm.down}, 200 if ready else 503
        )

    # ------------------------------------------------------------------ LoRA adapters (admin)
    # Run on the ops server's thread: the registry is a dict the step loop only reads (a lookup per
    # submit), and each change here is one dict operation.

    def _loras_view(self) -> dict[str, Any]:
        loras = self.core.loras
        return {
            "enabled": self.core.limits.max_loras > 0,
            "adapters": [
                {"name": m.name, "path": m.path, "users": len(self.core.lora_users(m.name))}
                for m in (loras.modules[n] for n in loras.names())
            ],
        }

    def _load_lora(self, body: Any) -> tuple[int, str, bytes]:
        name, path = (
            (body.get("lora_name"), body.get("lora_path")) if isinstance(body, dict) else (None, None)
        )
        if self.core.limits.max_loras <= 0:
            return json_response({"error": "LoRA is off: start with --max-loras >= 1"}, 400)
        if not isinstance(name, str) or not isinstance(path, str):
            return json_response({"error": "give lora_name and lora_path (strings)"}, 400)
        try:
            module = self.core.loras.add(name, path)
        except ValueError as exc:
            self.log.warning("lora_load_refused", name=name, path=path, error=str(exc))
            self.metrics.lora_admin.labels("load", "refused").inc()
            return json_response({"error": str(exc)}, 400)
        self.metrics.lora_admin.labels("load", "ok").inc()
        self.metrics.lora_loaded.set(len(self.core.loras.modules))
        self.log.info("lora_loaded", name=name, path=module.path, namespace=module.namespace)
        return json_response({"loaded": name, "path": module.path})

    def _unload_lora(self, body: Any) -> tuple[int, str, bytes]:
        name = body.get("lora_name") if isinstance(body, dict) else None
        if not isinstance(name, str):
            return json_response({"error": "give lora_name (a string)"}, 400)
        users = self.core.lora_users(name)
        if users:
            # Refused, not waited for: the caller decides whether to abort them or retry later.
            shown = ", ".join(users[:10]) + (f" and {len(users) - 10} more" if len(users) > 10 else "")
            self.metrics.lora_admin.labels("unload", "in_use").inc()
            return json_response(
                {"error": f"LoRA adapter {name!r} is in use by running requests: {shown}"}, 409
            )
        try:
            self.core.loras.remove(name)
        except KeyError as exc:
            return json_response({"error": exc.args[0]}, 404)
        self.log.info("lora_unloaded", name=name)
        self.metrics.lora_admin.labels("unload", "ok").inc()
        self.metrics.lora_loaded.set(len(self.core.loras.modules))
        return json_response({"unloaded": name})

    def _block_manager_ops_url(self) -> str:
        host = self.config.ops_host
        host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host  # bound everywhere: loopback works
        return f"http://{host}:{self.config.block_manager_ops_port}"

    def _watch_view(self) -> dict[str, Any]:
        m = self.metrics
        faults = {
            "workers_lost": ops_page.counter_total(m.workers_lost),
            "stale_results": ops_page.counter_total(m.stale_results),
            "block_manager_outages": ops_page.counter_total(m.bm_outages),
            "preemptions": ops_page.counter_total(m.preemptions),
            "rejected": ops_page.counter_total(m.rejected),
        }
        view = self.watch.view(time.monotonic(), self.core, self.liveness, faults)
        view["max_waiting_requests"] = self.config.max_waiting_requests
        view["block_manager_up"] = not self.bm.down
        return view

    def _requests_view(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "requests": [
                {
                    "request_id": r.request_id,
                    "status": r.status.value,
                    "worker_id": r.worker_id,
                    "prompt_tokens": len(r.prompt_token_ids),
                    "output_tokens": len(r.output_token_ids),
                    "age_s": round(now - r.arrival, 3),
                }
                for r in self.core.live_requests()
            ],
            "waiting": self.core.num_waiting,
            "running": self.core.num_running,
        }

    # ------------------------------------------------------------------ loop

    def serve(self) -> None:
        self.log.info(
            "scheduler_started",
            front=self.config.front_endpoint,
            workers=self.config.worker_endpoint,
            block_manager=self.config.block_manager_endpoint,
            owner=self.bm.owner,
            ops_port=self.ops.port if self.ops else None,
            max_model_len=self.model.max_model_len,
        )
        poller = zmq.Poller()
        poller.register(self.front.sock, zmq.POLLIN)
        poller.register(self.workers_sock, zmq.POLLIN)
        poller.register(self.worker_monitor, zmq.POLLIN)
        polled_bm = self.bm.sock
        poller.register(polled_bm, zmq.POLLIN)
        self.next_tick = 0.0
        next_renew = 0.0
        while not self.stopping:
            if self.bm.sock is not polled_bm:  # a lost block manager gets a fresh socket
                poller.unregister(polled_bm)
                polled_bm = self.bm.sock
                poller.register(polled_bm, zmq.POLLIN)
            # Sockets wake the poll (block-manager answers among them); a short timeout only serves
            # the timers. Never spin: on two cores a busy scheduler steals the worker's CPU.
            ready = dict(poller.poll(timeout=int(_POLL_S * 1000)))
            if polled_bm in ready:
                self._drain_block_manager()
            if self.workers_sock in ready:
                self._drain(self.workers_sock, recv_router, self.on_worker_message)
            if self.front.sock in ready:
                self._drain(
                    self.front.sock,
                    recv_routed,
                    lambda client, msg: self.front.on_message(client, msg, time.monotonic()),
                )
                self.plan_all = True  # a new request waits on the least-loaded worker: any of them
            if self.worker_monitor in ready:
                self._drain_monitor()
            now = time.monotonic()
            self.liveness.awake.turn(now, _POLL_S)
            if self.bm.overdue(now, self.liveness.awake):
                self.bm.lost("timeout")
            if now >= next_renew:
                next_renew = now + self.config.lease_renew_interval_s
                self.bm.renew_owner()
            if now >= self.next_tick:
                self.next_tick = now + 0.1
                self.tick(now)
                self.plan_all = True
            self.schedule_all()
        self.close()

    def _drain_monitor(self) -> None:
        while True:
            try:
                self.worker_monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.liveness.connection_closed(time.monotonic())
            # Evidence for a hang hunt: a step socket that reconnects hands its route over.
            self.log.info("worker_connection_closed")
            self.next_tick = 0.0  # check liveness now

    def _drain(
        self,
        sock: zmq.Socket,
        recv: Callable[[zmq.Socket, int], tuple[Any, dict[str, Any]]],
        handler: Callable[[Any, dict[str, Any]], None],
    ) -> None:
        """Up to a batch of frames from a ROUTER; `recv` says how far its peers may be routed."""
        for _ in range(512):
            try:
                identity, msg = recv(sock, self.config.max_message_bytes)
            except zmq.Again:
                return
            except RouterFrameError as exc:
                code = getattr(exc.error, "code", "bad_frame")
                self.metrics.rejected.labels(code).inc()
                self.log.warning("bad_frame", code=code, error=str(exc.error))
                send(sock, Error(code=code, message=str(exc.error)), to=exc.identity)
                continue
            handler(identity, msg)

    def _drain_block_manager(self) -> None:
        for _ in range(512):
            try:
                frame = self.bm.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                answer = self.bm.take(frame)
            except ProtocolError as exc:
                self.log.warning("bad_block_manager_reply", code=exc.code, error=exc.message)
                continue
            if isinstance(answer, PoolsReply):
                self.block_manager_back(answer)
            elif answer is not None:
                self.finish_step(*answer)
            if self.bm.sock.closed:
                return  # lost (a restart): the loop polls the new socket

    # ------------------------------------------------------------------ workers

    def on_worker_message(self, identity: bytes, frame: dict[str, Any]) -> None:
        now = time.monotonic()
        try:
            msg = read_message(frame, _FROM_WORKERS)
        except ProtocolError as exc:
            self.log.warning("bad_worker_message", type=frame.get("type"), code=exc.code, error=exc.message)
            return
        if isinstance(msg, StepResultMessage):
            link = self.liveness.links.get(msg.worker_id)
            if link is None or not link.active or msg.generation != link.generation:
                self.metrics.stale_results.inc()
                self.log.warning(
                    "fenced_step_result",
                    worker_id=msg.worker_id,
                    step=msg.result.step,
                    generation=msg.generation,
                    current=None if link is None else link.generation,
                )
                return  # from before its last reset (or a worker we dropped): recomputed elsewhere
            self.on_step_result(msg.worker_id, msg.result, now)
            self.to_plan.add(msg.worker_id)
        else:
            self.plan_all = True  # a heartbeat may activate a worker
            self.on_heartbeat(
                msg, now, step_socket=isinstance(msg, Hello) and identity == msg.worker_id.encode()
            )

    def on_heartbeat(self, msg: Heartbeat | Hello, now: float, step_socket: bool = False) -> None:
        if self.watch.heard(msg.worker_id, msg.incarnation):
            self.metrics.worker_restarts.inc()
        if self.liveness.restarted(msg):
            self.lose_worker(msg.worker_id, "restarted")
        elif self.liveness.reconnected(msg, step_socket):
            # Requeue now rather than wait out the step timeout; it rejoins with a new generation.
            self.lose_worker(msg.worker_id, "step socket reconnected")
        link, joined = self.liveness.heard(msg, now, step_socket)
        if joined:
            self.log.info(
                "worker_joined",
                worker_id=link.worker_id,
                num_blocks=link.num_blocks,
                block_size=link.block_size,
                max_model_len=link.max_model_len,
            )
        if not link.active and link.routable and not self.bm.down:
            self.activate(link)

    def activate(self, link: WorkerLink) -> None:
        # A worker we dropped may still hold request state (a late heartbeat, a block-manager
        # outage): it forgets everything before its first step. Harmless for a fresh one.
        # Each activation gets a new generation, and a result counts only if stamped with the
        # current one: whatever the worker computed before (it hung, was declared lost, woke up)
        # is fenced off, even a result whose step number happens to match the new window.
        self.generation += 1
        if not self.send_to_worker(link.worker_id, Reset(self.generation)):
            return
        link.generation = self.generation
        wid = link.worker_id
        if self.core.is_suspended(wid):
            since = self.core.suspended_since(wid) or 0.0
            parked = self.core.resume_worker(wid, link.pool_epoch, link.incarnation, link.pool_continued)
            if parked is not None:
                link.active = True
                self.metrics.workers.set(len(self.liveness.active_ids()))
                self.log.info(
                    "worker_resumed",
                    worker_id=wid,
                    parked=parked,
                    waited_s=round(time.monotonic() - since, 3),
                )
                return
            self.give_up_worker(
                wid, "back without its pool (a fresh segment, or the block manager dropped it)"
            )
        self.core.add_worker(wid, link.num_blocks, link.block_size)
        link.active = True
        self.metrics.workers.set(len(self.liveness.active_ids()))

    def send_to_worker(self, wid: str, message: ExecuteMessage | Reset) -> bool:
        try:
            self.workers_sock.send_multipart([wid.encode(), encode_message(message)], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH (ROUTER_MANDATORY) or a full queue
            self.lose_worker(wid, f"unroutable: {exc}")
            return False

    def lose_worker(self, wid: str, reason: str) -> None:
        link = self.liveness.drop(wid)
        if self.core.is_suspended(wid):
            return  # already waiting for it (a restart's first heartbeat says "restarted" again)
        if link is not None and link.active and link.pool_epoch and not self.bm.down:
            self.suspend_worker(link, reason)
            return
        moved = self.recompute_elsewhere(wid)
        self.count_lost(wid, reason, requeued=len(moved), was_active=bool(link and link.active))

    def suspend_worker(self, link: WorkerLink, reason: str) -> None:
        """Lost, but its pool lives on in shared memory: its running requests wait for it (they resume
        with nothing computed again); the others move now."""
        wid = link.worker_id
        out = self.core.suspend_worker(wid, time.monotonic(), link.pool_epoch, link.incarnation)
        if out.frees:
            self.bm.send(out.frees, time.monotonic())
        self.plan_all = True  # the moved requests wait on other workers now
        self.count_lost(
            wid,
            reason,
            suspended=True,
            parked=len(out.parked),
            requeued=len(out.moved),
            resume_timeout_s=self.config.kv_resume_timeout_s,
        )

    def recompute_elsewhere(self, wid: str) -> list[Request]:
        """The worker's requests move to other workers; the tables the block manager holds for them
        are freed. If only we think it is dead, it still holds them (the worker runs steps in order,
        so a step still queued there ends before any new one). Steps in flight may never run:
        nothing of these tables counts as written (num_computed 0). The frees follow any batch of
        this worker's still out, so they also free what that batch makes."""
        held = self.core.live_request_ids(wid)
        moved = self.core.remove_worker(wid)
        if held and not self.bm.down:
            self.bm.send([Free(rid, 0) for rid in held], time.monotonic())
        self.plan_all = True  # the moved requests wait on other workers now
        return moved

    def count_lost(self, wid: str, reason: str, **detail: object) -> None:
        """A lost worker in the metrics (and its step timeout, if that is why) and the log."""
        self.metrics.workers_lost.inc()
        if self.watch.lost(wid, reason, time.monotonic()):
            self.metrics.step_timeouts.inc()
        self.metrics.workers.set(len(self.liveness.active_ids()))
        self.log.warning("worker_lost", worker_id=wid, reason=reason, **detail)

    def give_up_worker(self, wid: str, why: str) -> None:
        """A suspended worker's requests stop waiting for it: they recompute elsewhere."""
        moved = self.recompute_elsewhere(wid)
        self.log.warning("suspended_worker_given_up", worker_id=wid, reason=why, requeued=len(moved))

    def on_step_result(self, wid: str, result: StepResult, now: float) -> None:
        if not self.core.has_worker(wid):
            return  # a step of a worker already declared lost or reset: its tokens are recomputed
        self.liveness.touch(wid, now)
        if not self.core.expects_result(wid, result.step):
            self.log.warning("stale_step_result", worker_id=wid, step=result.step)
            return
        sent_at = self.core.oldest_step_sent_at(wid)  # of this step: results come in order
        if sent_at is not None:
            self.liveness.steps.observe(wid, now - sent_at)
        self.metrics.step_time.observe(result.timings.get("step_s", result.timings.get("forward_s", 0.0)))
        self.metrics.worker_idle.labels(wid).inc(result.timings.get("idle_s", 0.0))
        if "lora_adapters" in result.timings:
            self.metrics.lora_adapters_per_step.observe(result.timings["lora_adapters"])
            load_s = result.timings.get("lora_load_s")
            if load_s is not None:
                self.metrics.lora_worker_loads.inc()
                self.metrics.lora_worker_load_s.inc(load_s)
            self.watch.lora_step(int(result.timings["lora_adapters"]), load_s)
        self.metrics.worker_busy.labels(wid).inc(result.timings.get("step_s", 0.0))
        self.watch.step(
            wid,
            result.timings.get("step_s", 0.0),
            len(result.token_ids) + sum(len(s.more_token_ids) for s in result.speculation),
        )
        stats = self.core.stats
        before = (stats.preemptions, stats.spec_proposed, stats.spec_accepted, stats.spec_decodes)
        self.front.dispatch(self.core.on_step_result(wid, result, now), now)
        self.metrics.preemptions.inc(stats.preemptions - before[0])
        if stats.spec_decodes != before[3]:
            self.metrics.spec_proposed.inc(stats.spec_proposed - before[1])
            self.metrics.spec_accepted.inc(stats.spec_accepted - before[2])
            self.metrics.spec_decodes.inc(stats.spec_decodes - before[3])
            self.metrics.spec_row_cost.set(self.core.speculation.row_cost)

    # ------------------------------------------------------------------ block manager

    def block_manager_lost(self, reason: str) -> None:
        """Every table may be gone: pause, recompute everything once it answers again."""
        self.core.set_owner(self.bm.owner)
        self.metrics.bm_outages.inc()
        for wid in self.core.worker_ids():  # suspended ones too: their tables are gone as well
            self.core.remove_worker(wid)
        for link in self.liveness.links.values():
            link.active = False
        self.log.error("block_manager_lost", reason=reason, new_owner=self.bm.owner)

    def block_manager_back(self, reply: PoolsReply) -> None:
        self.log.info("block_manager_back", instance=reply.instance, pools=sorted(reply.pools))
        self.plan_all = True
        for link in self.liveness.links.values():
            if link.worker_id in reply.pools and not link.active and link.routable:
                self.activate(link)

    # ------------------------------------------------------------------ timers and steps

    def tick(self, now: float) -> None:
        for wid in self.liveness.suspected_hangs(now, self.core.oldest_step_sent_at):
            self.dump_stacks(wid, now)
        for wid, reason in self.liveness.overdue(now, self.core.oldest_step_sent_at):
            if reason.startswith(STEP_UNANSWERED):
                self.log.error(
                    "step_timeout", worker_id=wid, reason=reason, **self.liveness.steps.describe(wid)
                )
            self.lose_worker(wid, reason)
        for wid in self.core.worker_ids():
            since = self.core.suspended_since(wid)
            if since is not None and now - since > self.config.kv_resume_timeout_s:
                self.give_up_worker(
                    wid, f"not back within kv_resume_timeout_s ({self.config.kv_resume_timeout_s} s)"
                )
        self.metrics.suspended.set(sum(1 for wid in self.core.worker_ids() if self.core.is_suspended(wid)))
        self.front.abort_lapsed_clients(now, self.config.client_timeout_s)
        self.front.dispatch(self.core.expire(now), now)
        if self.bm.down:
            self.bm.probe()
        self.metrics.waiting.set(self.core.num_waiting)
        self.metrics.running.set(self.core.num_running)
        if self.watch.history.due(now):
            self.watch.sample(now, self.core.num_waiting, self.core.num_running)

    def sync_kv_counters(self) -> None:
        """The resumed / recomputed counters follow the core's stats, which only a commit moves: synced
        right after it, so that a client that saw the step's tokens reads counters that include it."""
        stats = self.core.stats
        counted = (stats.resumed_requests, stats.recomputed_tokens)
        if counted != self._counted:
            self.metrics.resumed.inc(counted[0] - self._counted[0])
            self.metrics.recomputed.inc(counted[1] - self._counted[1])
            self._counted = counted

    def dump_stacks(self, wid: str, now: float) -> None:
        """A suspected hang: our stacks and the worker's into the logs, while it is still stuck."""
        oldest = self.core.oldest_step_sent_at(wid)
        age = 0.0 if oldest is None else now - oldest
        self.log.error(
            "step_overdue_dumping_stacks",
            worker_id=wid,
            step_age_s=round(age, 3),
            **self.liveness.steps.describe(wid),
        )
        if sys.__stderr__ is not None:  # None where the process was started without a stderr
            faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
        try:  # to its heartbeat thread, which answers even while its step thread is stuck
            self.workers_sock.send_multipart(
                [f"{wid}/hb".encode(), encode_message(DumpStacks(round(age, 3)))], zmq.NOBLOCK
            )
        except zmq.ZMQError as exc:  # unroutable: the heartbeat socket is gone too
            self.log.warning("dump_stacks_unroutable", worker_id=wid, error=str(exc))

    def schedule_all(self) -> None:
        """Plan a step for every worker that something happened to (a result, an answer; every worker
        on a client's frame or a tick) with room in its pipeline window and no plan out: each plan's
        batch goes to the block manager, whose answer (`finish_step`) sends the step (at once where
        the batch is empty)."""
        if self.bm.down:
            return
        # Asking every worker on every wake-up cost more than the planning at 16 workers.
        ids = (
            self.core.worker_ids() if self.plan_all else [w for w in self.to_plan if self.core.has_worker(w)]
        )
        self.plan_all = False
        self.to_plan.clear()
        for wid in ids:
            if not self.core.can_schedule(wid):
                continue
            now = time.monotonic()
            before = self.core.stats.preemptions  # planning preempts too, not only results
            plan, events = self.core.begin_step(wid, now)
            self.metrics.preemptions.inc(self.core.stats.preemptions - before)
            self.front.dispatch(events, now)
            if plan is None:
                continue
            if plan.block_ops:
                self.bm.send(plan.block_ops, now, plan)
            else:  # decodes within their blocks: nothing to ask
                self.finish_step(plan, BlockAnswers([], {}))

    def finish_step(self, plan: StepPlan, answers: BlockAnswers) -> None:
        now = time.monotonic()
        self.to_plan.add(plan.worker_id)
        outcome = self.core.finish_step(plan, answers, now)
        self.sync_kv_counters()
        self.front.dispatch(outcome.events, now)
        if outcome.execute is not None:
            self.send_to_worker(plan.worker_id, ExecuteMessage(outcome.execute))

    def close(self) -> None:
        if self.ops:
            self.ops.stop()
        if self.auth:
            self.auth.stop()
        self.workers_sock.disable_monitor()
        for sock in (self.worker_monitor, self.front.sock, self.workers_sock):
            sock.close(0)
        self.bm.close()
        self.ctx.term()


def run(config: ServeConfig) -> None:
    service = SchedulerService(config)
    on_stop_signals(lambda: setattr(service, "stopping", True))
    service.serve()
