"""The scheduler process: the core between three sockets and a few timers.

    clients  --Submit/Abort/Ping-->  front ROUTER   --Accepted/Delta/Finished/Error/Pong-->
    workers  --heartbeat/step_result-->  worker ROUTER  --execute/reset-->
    block manager  <--block_ops / renew_owner / pools--  DEALER (one batched RPC per step)

Failure handling (DESIGN §7): a worker silent for worker_timeout_s, or with a step unanswered for
step_timeout_s, is dropped and its requests recompute elsewhere; a block manager that stops
answering (or comes back as a new instance) costs every table: all requests recompute once it is
back, under a new lease owner so that whatever the old one held simply expires.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from pagedserve.services.scheduler.admission import RequestRejected
from pagedserve.services.scheduler.frontdoor import (
    ClientBook,
    FinishedStore,
    parse_client_message,
    tokenize_submit,
)
from pagedserve.services.scheduler.metrics import SchedulerMetrics
from pagedserve.services.scheduler.model_info import ModelInfo, load_model_info
from pagedserve.services.scheduler.scheduler import OutputEvent, RequestDone, Scheduler, SchedulerLimits
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.log import configure_logging, on_stop_signals
from pagedserve.shared.ops_http import OpsServer, json_response
from pagedserve.shared.protocol.blocks import BlockBatch, BlockReply, free_op
from pagedserve.shared.protocol.codec import ProtocolError, decode
from pagedserve.shared.protocol.control import Heartbeat, Hello, Pools, PoolsReply, RenewOwner, Reset
from pagedserve.shared.protocol.frontend import (
    Abort,
    Accepted,
    CompletionOutput,
    Delta,
    Error,
    Finished,
    Ping,
    Pong,
    Submit,
    Usage,
)
from pagedserve.shared.protocol.messages import encode_message, message_table, read_message
from pagedserve.shared.protocol.step import ExecuteMessage, StepResult, StepResultMessage
from pagedserve.shared.transport import (
    CurveKeys,
    RouterFrameError,
    make_socket,
    recv_router,
    send,
    start_authenticator,
)
from prometheus_client import generate_latest

# What workers send the scheduler (step socket and heartbeat socket).
_FROM_WORKERS = message_table(Heartbeat, Hello, StepResultMessage)


@dataclass(slots=True)
class WorkerLink:
    worker_id: str
    incarnation: str
    num_blocks: int
    block_size: int
    last_heartbeat: float
    active: bool = False  # known to the core (its pool is registered and reachable)
    routable: bool = False  # its step socket has spoken to us: steps sent to it arrive


class SchedulerService:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.log = configure_logging("scheduler", config.log_format, config.log_level)
        self.model: ModelInfo = load_model_info(config.model, config.max_model_len)
        self.base_owner = f"scheduler-{uuid.uuid4().hex[:8]}"
        self.epoch = 0
        limits = SchedulerLimits(
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.aging_s,
            config.pipeline_depth,
            self.model.max_model_len,
        )
        self.core = Scheduler(limits, self.model.eos_token_ids, self.model.tokenizer, owner=self.owner)
        self.clients = ClientBook(config.max_inflight_per_client)
        self.finished = FinishedStore()
        self.links: dict[str, WorkerLink] = {}
        self.metrics = SchedulerMetrics()
        self.streams: dict[tuple[str, int], list[int]] = {}  # (request, index) -> [tokens sent, chars sent]
        self.ctx = zmq.Context()
        keys = CurveKeys(Path(config.curve_keys_dir)) if config.curve_keys_dir else None
        self.auth = start_authenticator(self.ctx, keys) if keys else None
        mk = config.max_message_bytes
        self.front = make_socket(self.ctx, zmq.ROUTER, max_message_bytes=mk, curve_server=keys)
        self.front.bind(config.front_endpoint)
        self.workers_sock = make_socket(self.ctx, zmq.ROUTER, max_message_bytes=mk, curve_server=keys)
        # A step to a worker whose socket is gone must fail loudly, not vanish: that worker is lost.
        self.workers_sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.workers_sock.bind(config.worker_endpoint)
        # A SIGKILLed worker's TCP connection closes at once: that event shortens the heartbeat
        # timeout for a moment, so a death is noticed in well under a second, not worker_timeout_s.
        self.worker_monitor = self.workers_sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.disconnect_seen_at = float("-inf")
        self.keys = keys
        self.bm = self._bm_socket()
        self.bm_seq = 0
        self.bm_instance: str | None = None
        self.bm_down = False
        self.stopping = False
        self.ops: OpsServer | None = None
        if config.scheduler_ops_port:
            self.ops = OpsServer(
                config.ops_host,
                config.scheduler_ops_port,
                {
                    "/healthz": lambda: json_response({"ok": True}),
                    "/readyz": self._readyz,
                    "/requests": lambda: json_response(self._requests_view()),
                    "/metrics": lambda: (
                        200,
                        "text/plain; version=0.0.4",
                        generate_latest(self.metrics.registry),
                    ),
                },
                admin_token=config.admin_token,
            ).start()

    @property
    def owner(self) -> str:
        return f"{self.base_owner}:{self.epoch}"

    def _bm_socket(self) -> zmq.Socket:
        sock = make_socket(
            self.ctx, zmq.DEALER, max_message_bytes=self.config.max_message_bytes, curve_client=self.keys
        )
        sock.connect(self.config.block_manager_endpoint)
        return sock

    # ------------------------------------------------------------------ ops views

    def _readyz(self) -> tuple[int, str, bytes]:
        live = [w for w, link in self.links.items() if link.active]
        ready = bool(live) and not self.bm_down
        return json_response(
            {"ready": ready, "workers": live, "block_manager": not self.bm_down}, 200 if ready else 503
        )

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
                for r in list(self.core.requests.values())
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
            owner=self.owner,
            ops_port=self.ops.port if self.ops else None,
            max_model_len=self.model.max_model_len,
        )
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.workers_sock, zmq.POLLIN)
        poller.register(self.worker_monitor, zmq.POLLIN)
        self.next_tick = 0.0
        next_renew = 0.0
        sent = False
        while not self.stopping:
            # Sockets wake the poll; a short timeout only serves the timers. Never spin: on two
            # cores a busy scheduler steals the worker's CPU.
            ready = dict(poller.poll(timeout=0 if sent else 10))
            if self.workers_sock in ready:
                self._drain(self.workers_sock, self.on_worker_message)
            if self.front in ready:
                self._drain(self.front, self.on_client_message)
            if self.worker_monitor in ready:
                self._drain_monitor()
            now = time.monotonic()
            if now >= next_renew:
                next_renew = now + self.config.lease_renew_interval_s
                send(self.bm, RenewOwner(self.owner))
            if now >= self.next_tick:
                self.next_tick = now + 0.1
                self.tick(now)
            sent = self.schedule_all()
        self.close()

    def _drain_monitor(self) -> None:
        while True:
            try:
                self.worker_monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.disconnect_seen_at = time.monotonic()
            self.next_tick = 0.0  # check liveness now

    def _drain(self, sock: zmq.Socket, handler: Any) -> None:
        for _ in range(512):
            try:
                identity, msg = recv_router(sock, self.config.max_message_bytes)
            except zmq.Again:
                return
            except RouterFrameError as exc:
                code = getattr(exc.error, "code", "bad_frame")
                self.metrics.rejected.labels(code).inc()
                self.log.warning("bad_frame", code=code, error=str(exc.error))
                send(sock, Error(code=code, message=str(exc.error)), to=exc.identity)
                continue
            handler(identity, msg)

    # ------------------------------------------------------------------ clients

    def on_client_message(self, client: bytes, msg: dict[str, Any]) -> None:
        now = time.monotonic()
        self.clients.seen(client, now)
        rid = msg.get("request_id") if isinstance(msg.get("request_id"), str) else None
        try:
            parsed = parse_client_message(msg)
            if isinstance(parsed, Ping):
                send(self.front, Pong(), to=client)
            elif isinstance(parsed, Abort):
                self.abort(parsed.request_id, client)
            else:
                self.submit(parsed, client, now)
        except RequestRejected as exc:
            self.metrics.rejected.labels(exc.code).inc()
            self.log.warning("request_rejected", request_id=rid, code=exc.code, error=exc.message)
            send(self.front, Error(code=exc.code, message=exc.message, request_id=rid), to=client)

    def submit(self, submit: Submit, client: bytes, now: float) -> None:
        rid = submit.request_id
        stored = self.finished.get(rid)
        if stored is not None:  # a retry of something already done: answer, do not run it again
            send(self.front, stored, to=client)
            return
        if rid in self.core.groups:
            if not submit.attach:
                raise RequestRejected(
                    "duplicate_request_id",
                    f"request_id: {rid!r} is already live; use a new id, or attach=True to reconnect",
                )
            self.clients.reroute(client, rid, submit.stream)
            self._replay(rid, client)
            return
        tokens = tokenize_submit(
            submit, self.model.tokenizer, self.model.max_model_len, self.model.vocab_size
        )
        self.clients.admit(client, rid, submit.stream)
        timeout = submit.timeout_s or self.config.request_timeout_s
        self.core.add_request(rid, tokens, submit.sampling, now, deadline=now + timeout)
        self.metrics.tokens.labels("prompt").inc(len(tokens))
        self.log.info(
            "request_accepted",
            request_id=rid,
            prompt_tokens=len(tokens),
            max_tokens=submit.sampling.max_tokens,
            n=submit.sampling.n,
        )
        send(self.front, Accepted(request_id=rid, num_prompt_tokens=len(tokens)), to=client)

    def _replay(self, rid: str, client: bytes) -> None:
        """A reconnected client gets everything so far; it keeps what it lacks by offset."""
        num_prompt_tokens = len(self.core.groups[rid][0].prompt_token_ids)
        send(self.front, Accepted(request_id=rid, num_prompt_tokens=num_prompt_tokens), to=client)
        if not self.clients.streaming.get(rid):
            return
        for req in self.core.groups[rid]:
            if req.output_token_ids:
                text = self.core.texts[req.request_id]
                delta = Delta(
                    request_id=rid,
                    index=req.index,
                    token_ids=list(req.output_token_ids),
                    text=text.text[: text.emitted],
                )
                send(self.front, delta, to=client)

    def abort(self, rid: str, client: bytes) -> None:
        if rid not in self.core.groups:
            raise RequestRejected("unknown_request", f"request_id: {rid!r} is not live")
        self.log.info("request_aborted", request_id=rid)
        self.dispatch(self.core.abort(rid), time.monotonic())

    # ------------------------------------------------------------------ events -> clients

    def dispatch(self, events: list[OutputEvent | RequestDone], now: float) -> None:
        for event in events:
            if isinstance(event, OutputEvent):
                self._send_delta(event, now)
            else:
                self._send_done(event, now)

    def _send_delta(self, ev: OutputEvent, now: float) -> None:
        sent = self.streams.setdefault((ev.request_id, ev.index), [0, 0])
        group = self.core.groups.get(ev.request_id)
        if sent[0] == 0 and ev.token_ids and group:
            self.metrics.ttft.observe(now - group[0].arrival)
        self.metrics.tokens.labels("generated").inc(len(ev.token_ids))
        client = self.clients.route.get(ev.request_id)
        if client is not None and self.clients.streaming.get(ev.request_id) and (ev.token_ids or ev.text):
            # Per token: built without validation, the scheduler is its own trusted author.
            delta = Delta.model_construct(
                request_id=ev.request_id,
                index=ev.index,
                offset=sent[0],
                text_offset=sent[1],
                token_ids=ev.token_ids,
                text=ev.text,
                logprobs=ev.logprobs,
            )
            send(self.front, delta, to=client)
        sent[0] += len(ev.token_ids)
        sent[1] += len(ev.text)

    def _send_done(self, done: RequestDone, now: float) -> None:
        for req in done.completions:
            self.streams.pop((done.request_id, req.index), None)
            if (
                req.first_token_at is not None
                and req.last_token_at is not None
                and len(req.output_token_ids) > 1
            ):
                self.metrics.itl.observe(
                    (req.last_token_at - req.first_token_at) / (len(req.output_token_ids) - 1)
                )
        head = done.completions[0]
        self.metrics.e2e.observe(now - head.arrival)
        self.metrics.finished.labels(done.error_code or head.finish_reason or "unknown").inc()
        client = self.clients.done(done.request_id)
        if done.error_code is not None:
            message = {
                "no_workers": "no live worker could serve the request before its timeout",
                "timeout": "the request did not finish before its timeout",
                "too_large_for_pool": "the request needs more KV blocks than a worker's whole pool",
            }.get(done.error_code, done.error_code)
            reply: Finished | Error = Error(code=done.error_code, message=message, request_id=done.request_id)
        else:
            reply = Finished(
                request_id=done.request_id,
                outputs=[
                    CompletionOutput(
                        index=r.index,
                        token_ids=list(r.output_token_ids),
                        text=text,
                        finish_reason=r.finish_reason or "abort",
                        logprobs=lps,
                    )
                    for r, text, lps in zip(done.completions, done.texts, done.logprobs, strict=True)
                ],
                usage=Usage(
                    prompt_tokens=done.num_prompt_tokens,
                    completion_tokens=sum(len(r.output_token_ids) for r in done.completions),
                    cached_tokens=done.num_cached_tokens,
                ),
            )
        self.finished.put(done.request_id, reply)
        self.log.info(
            "request_finished",
            request_id=done.request_id,
            reason=done.error_code or head.finish_reason,
            completion_tokens=sum(len(r.output_token_ids) for r in done.completions),
        )
        if client is not None:
            send(self.front, reply, to=client)

    # ------------------------------------------------------------------ workers

    def on_worker_message(self, identity: bytes, frame: dict[str, Any]) -> None:
        now = time.monotonic()
        try:
            msg = read_message(frame, _FROM_WORKERS)
        except ProtocolError as exc:
            self.log.warning("bad_worker_message", type=frame.get("type"), code=exc.code, error=exc.message)
            return
        if isinstance(msg, StepResultMessage):
            self.on_step_result(msg.worker_id, msg.result, now)
        else:
            self.on_heartbeat(
                msg, now, step_socket=isinstance(msg, Hello) and identity == msg.worker_id.encode()
            )

    def on_heartbeat(self, msg: Heartbeat | Hello, now: float, step_socket: bool = False) -> None:
        wid, inc = msg.worker_id, msg.incarnation
        link = self.links.get(wid)
        if link is not None and link.incarnation != inc:
            self.lose_worker(wid, "restarted")  # same name, new process: its old state is gone
            link = None
        if link is None:
            link = self.links[wid] = WorkerLink(wid, inc, msg.num_blocks, msg.block_size, now)
            self.log.info(
                "worker_joined", worker_id=wid, num_blocks=link.num_blocks, block_size=link.block_size
            )
        link.last_heartbeat = now
        link.routable = link.routable or step_socket
        if not link.active and link.routable and not self.bm_down:
            self.activate(link)

    def activate(self, link: WorkerLink) -> None:
        # A worker we dropped may still hold request state (a late heartbeat, a block-manager
        # outage): it forgets everything before its first step. Harmless for a fresh one.
        if not self.send_to_worker(link.worker_id, Reset()):
            return
        self.core.add_worker(link.worker_id, link.num_blocks, link.block_size)
        link.active = True
        self.metrics.workers.set(sum(1 for w in self.links.values() if w.active))

    def send_to_worker(self, wid: str, message: ExecuteMessage | Reset) -> bool:
        try:
            self.workers_sock.send_multipart([wid.encode(), encode_message(message)], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH (ROUTER_MANDATORY) or a full queue
            self.lose_worker(wid, f"unroutable: {exc}")
            return False

    def lose_worker(self, wid: str, reason: str) -> None:
        link = self.links.pop(wid, None)
        # If only we think it is dead, the block manager still holds these tables: free them.
        # (The worker runs steps in order, so a step still queued there ends before any new one.)
        held = [
            r.request_id for r in self.core.requests.values() if r.worker_id == wid and r.num_scheduled > 0
        ]
        moved = self.core.remove_worker(wid)
        if held and not self.bm_down:
            self.block_rpc([free_op(rid) for rid in held])
        self.metrics.workers_lost.inc()
        self.metrics.workers.set(sum(1 for w in self.links.values() if w.active))
        self.log.warning(
            "worker_lost",
            worker_id=wid,
            reason=reason,
            requeued=len(moved),
            was_active=bool(link and link.active),
        )

    def on_step_result(self, wid: str, result: StepResult, now: float) -> None:
        if wid not in self.core.workers:
            return  # a step of a worker already declared lost or reset: its tokens are recomputed
        link = self.links.get(wid)
        if link is not None:
            link.last_heartbeat = now
        state = self.core.workers[wid]
        if not state.window.steps or state.window.steps[0].step != result.step:
            self.log.warning("stale_step_result", worker_id=wid, step=result.step)
            return
        self.metrics.step_time.observe(result.timings.get("step_s", result.timings.get("forward_s", 0.0)))
        self.metrics.worker_idle.labels(wid).inc(result.timings.get("idle_s", 0.0))
        self.metrics.worker_busy.labels(wid).inc(result.timings.get("step_s", 0.0))
        before = self.core.stats.preemptions
        self.dispatch(self.core.on_step_result(wid, result, now), now)
        self.metrics.preemptions.inc(self.core.stats.preemptions - before)

    # ------------------------------------------------------------------ block manager

    def block_rpc(self, ops: list[list[Any]]) -> dict[str, Any] | None:
        """One batched RPC; None if the block manager did not answer in time (it is then down)."""
        self.bm_seq += 1
        seq = self.bm_seq
        send(self.bm, BlockBatch(seq, ops))
        deadline = time.monotonic() + self.config.rpc_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not self.bm.poll(int(left * 1000) + 1):
                break
            frame = decode(self.bm.recv(), self.config.max_message_bytes)
            if frame.get("type") != BlockReply.TYPE or frame.get("seq") != seq:
                continue  # a late reply to a batch that timed out, or a probe's
            reply = BlockReply.from_wire(frame)
            if self.bm_instance is not None and reply.instance != self.bm_instance:
                self.block_manager_lost("restarted")
                return None
            self.bm_instance = reply.instance
            return reply.answer
        self.block_manager_lost("timeout")
        return None

    def block_manager_lost(self, reason: str) -> None:
        """Every table may be gone: pause, recompute everything once it answers again."""
        self.bm_down = True
        self.bm_instance = None
        self.epoch += 1  # a new lease owner: leases of the old one expire and are reaped
        self.core.owner = self.owner
        self.metrics.bm_outages.inc()
        self.bm.close(0)  # drop anything queued for the old instance
        self.bm = self._bm_socket()
        for wid, link in self.links.items():
            if link.active:
                self.core.remove_worker(wid)
                link.active = False
        self.log.error("block_manager_lost", reason=reason, new_owner=self.owner)

    def probe_block_manager(self) -> None:
        self.bm_seq += 1
        send(self.bm, Pools(self.bm_seq))
        if not self.bm.poll(200):
            return
        frame = decode(self.bm.recv(), self.config.max_message_bytes)
        if frame.get("type") != PoolsReply.TYPE:
            return
        reply = PoolsReply.from_wire(frame)
        self.bm_down = False
        self.bm_instance = reply.instance
        self.log.info("block_manager_back", instance=self.bm_instance, pools=sorted(reply.pools))
        for link in self.links.values():
            if link.worker_id in reply.pools and not link.active and link.routable:
                self.activate(link)

    # ------------------------------------------------------------------ timers and steps

    def tick(self, now: float) -> None:
        timeout = self.config.worker_timeout_s
        if now - self.disconnect_seen_at < timeout:
            # Some worker connection just closed: whoever also missed a heartbeat and a half is gone.
            timeout = min(timeout, 1.5 * self.config.heartbeat_interval_s)
        for wid, link in list(self.links.items()):
            silent = now - link.last_heartbeat
            state = self.core.workers.get(wid)
            oldest = state.window.oldest_sent_at() if state else None
            if silent > timeout:
                self.lose_worker(wid, f"no heartbeat for {silent:.1f}s")
            elif oldest is not None and now - oldest > self.config.step_timeout_s:
                self.lose_worker(wid, f"step unanswered for {now - oldest:.1f}s")
        for client, ids in self.clients.lapsed(now, self.config.client_timeout_s):
            self.log.warning("client_lost", requests=ids)
            for rid in ids:
                self.dispatch(self.core.abort(rid), now)
            self.clients.last_seen.pop(client, None)
        self.dispatch(self.core.expire(now), now)
        if self.bm_down:
            self.probe_block_manager()
        self.metrics.waiting.set(self.core.num_waiting)
        self.metrics.running.set(self.core.num_running)

    def schedule_all(self) -> bool:
        """Fill every worker's pipeline window; True if any step was sent."""
        sent = False
        if self.bm_down:
            return sent
        for wid in list(self.core.workers):
            while self.core.can_schedule(wid):
                now = time.monotonic()
                plan = self.core.schedule(wid, now)
                self.dispatch(self.core.take_rejected(), now)
                if not plan.block_ops:
                    break
                reply = self.block_rpc(plan.block_ops)
                if reply is None:
                    return sent
                execute = self.core.commit(plan, reply, now)
                if execute is not None:
                    if not self.send_to_worker(wid, ExecuteMessage(execute)):
                        break
                    sent = True
                elif plan.entries or not all(op[0] == "free" for op in plan.block_ops):
                    break
        return sent

    def close(self) -> None:
        if self.ops:
            self.ops.stop()
        if self.auth:
            self.auth.stop()
        self.workers_sock.disable_monitor()
        for sock in (self.worker_monitor, self.front, self.workers_sock, self.bm):
            sock.close(0)
        self.ctx.term()


def run(config: ServeConfig) -> None:
    service = SchedulerService(config)
    on_stop_signals(lambda: setattr(service, "stopping", True))
    service.serve()
