"""The worker process: the model runner behind a DEALER socket, heartbeats from a side thread.

    worker --register-->  block manager (waits for "registered": the pool exists before any step)
    worker <--execute {Execute}--  scheduler;  worker --step_result {StepResult}--> scheduler
    worker <--reset--  scheduler (the block manager lost every table: forget all request state)
    heartbeat thread: every heartbeat_interval_s, {worker_id, incarnation, num_blocks, ...} to both.

A step runs on the main thread and may take a second on a CPU; the heartbeats must not wait for
it, so they go from their own thread with their own sockets (ZeroMQ sockets are single-threaded).
A step that raises leaves the runner's state unknown: the worker exits and is restarted.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from pagedserve.services.worker.kv_budget import PoolTooSmall, check_fits
from pagedserve.services.worker.kv_segment import NameHeld, lock_name
from pagedserve.services.worker.pool_attach import PoolAttachment, attach_pool
from pagedserve.services.worker.simulated import SimulatedRunner
from pagedserve.services.worker.tensor_parallel import GroupRefused
from pagedserve.shared import failpoints
from pagedserve.shared.config import ServeConfig
from pagedserve.shared.log import configure_logging, on_stop_signals
from pagedserve.shared.lora_modules import parse_lora_modules
from pagedserve.shared.proc_memory import resident_bytes
from pagedserve.shared.protocol.codec import ProtocolError, decode
from pagedserve.shared.protocol.control import DumpStacks, Heartbeat, Hello, Register, Registered, Reset
from pagedserve.shared.protocol.frontend import Error
from pagedserve.shared.protocol.messages import message_table, read_message
from pagedserve.shared.protocol.step import ExecuteMessage, StepResultMessage
from pagedserve.shared.transport import CurveKeys, make_socket, send

if TYPE_CHECKING:
    from pagedserve.services.worker.runner import ModelRunner
    from pagedserve.services.worker.tensor_parallel.group import RankGroup

# What the scheduler sends a worker's step socket, and its heartbeat socket.
_FROM_SCHEDULER = message_table(ExecuteMessage, Reset)
_TO_HEARTBEAT = message_table(DumpStacks)
_FROM_BLOCK_MANAGER = message_table(Registered, Error)  # Error: it could not read our register


class WorkerService:
    def __init__(self, config: ServeConfig, named: bool = True) -> None:
        """`named` false: a standby, loaded but nameless until `take_name` (standby.py)."""
        from pagedserve.services.checkpoint import resolve_model

        started = time.monotonic()
        # Where a start (or a restart) spends its time, for the start log: the process up to here
        # (interpreter, imports), the model, the pool, the registration.
        self.startup: dict[str, float] = {"process_s": round(process_age_s(), 3)}
        # Resident memory before and after the model loads: what the runtime (the interpreter, torch, our
        # modules) holds, and what the weights add.
        self.memory: dict[str, float | None] = {}
        self.config = config
        self.worker_id = config.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.incarnation = uuid.uuid4().hex
        self.log = configure_logging("worker", config.log_format, config.log_level).bind(
            worker_id=self.worker_id
        )
        self.model_path = resolve_model(config.model)
        # Our name's segment, locked before the model loads: a duplicate is refused at once.
        self.name_lock = (
            lock_name(config.kv_segment_dir, self.worker_id)
            if named and config.kv_segment_dir and config.simulate_step_ms is None and config.device == "cpu"
            else None
        )
        self.runner: ModelRunner | SimulatedRunner
        self.group: RankGroup | None = None  # the other tensor-parallel ranks, when we are rank 0
        if config.simulate_step_ms is not None:  # no torch, no weights: a fleet on one machine
            self.runner = SimulatedRunner(
                self.model_path,
                step_ms=config.simulate_step_ms,
                block_size=config.block_size,
                num_blocks=config.num_blocks,
            )
        else:
            from pagedserve.services.worker.runner import ModelRunner  # lazily: torch

            self.memory["rss_before_load_mib"] = resident_mib()
            if config.num_threads:
                import torch

                torch.set_num_threads(config.num_threads)
            if config.tensor_parallel_size > 1:
                from pagedserve.services.worker.tensor_parallel.group import RankGroup

                self.group = RankGroup(config, Path(self.model_path), self.log)
            self.runner = ModelRunner.from_config(
                self.model_path,
                config,
                # What only a deployment's worker reads (an engine in one process keeps the defaults).
                workers_per_machine=config.workers_per_machine * ranks_per_machine(config),
                defer_pool=True,  # its name decides which segment holds it
                ranks=self.group,
            )
            if self.group is not None:
                self.group.loaded()
            # The start-time adapters are checked against the model now: a bad one stops the worker
            # with the file or module named, not the first request that uses it.
            if self.runner.loras is not None:
                for name, path in parse_lora_modules(config.lora_modules):
                    self.runner.loras.load(name, str(Path(path).resolve()))
        self.startup["load_s"] = round(time.monotonic() - started, 3)
        self.memory["rss_loaded_mib"] = resident_mib()
        self.pool = PoolAttachment()
        self.pool_continued = False  # the block manager kept our tables (set at registration)
        self.keys = CurveKeys(Path(config.curve_keys_dir)) if config.curve_keys_dir else None
        self.ctx = zmq.Context()
        self.stopping = threading.Event()
        self.generation = 0  # of the last reset obeyed: stamped on every step result
        if named:
            self.take_name(config)

    def take_name(self, config: ServeConfig) -> None:
        """Become `config.worker_id` and attach its pool: its segment when the deployment keeps
        pools in shared memory (a restart continues it), else private memory."""
        self.config = config
        if config.worker_id:
            self.worker_id = config.worker_id
            self.log = self.log.bind(worker_id=self.worker_id)
        if isinstance(self.runner, SimulatedRunner):
            return
        started = time.monotonic()
        # A group's other ranks keep their K/V in private memory: a segment of rank 0's alone, continued
        # after a restart, would pair its K/V with the others' lost ones. The group's pool dies with it.
        segment_dir = config.kv_segment_dir if self.group is None else None
        self.pool = attach_pool(self.runner, segment_dir, self.worker_id, self.log, self.name_lock)
        from pagedserve.services.worker.kv_failpoints import watch_kv_writes  # lazily: torch

        runner = self.runner
        watch_kv_writes(runner.backend, lambda: runner.prefilling)  # test deployments' failpoints only
        # Before registering: a pool that cannot hold one max_model_len request is a
        # configuration to change, not a worker to restart (exit EX_CONFIG, see run()).
        check_fits(self.runner.pool_sizing, self.runner.served_len)
        self.startup["pool_s"] = round(time.monotonic() - started, 3)

    def pool_facts(self) -> dict[str, object]:
        sizing = getattr(self.runner, "pool_sizing", None)
        return {} if sizing is None else sizing.describe()

    def announcement(
        self, kind: type[Hello] | type[Heartbeat] | type[Register], connection: int = 0
    ) -> Hello | Heartbeat | Register:
        """Who this worker is: sent with every heartbeat so a restarted peer learns it at once."""
        return kind(
            self.worker_id,
            self.incarnation,
            self.runner.num_blocks,
            self.runner.block_size,
            self.runner.max_model_len,
            str(self.model_path),
            self.runner.runtime,
            connection,
            self.pool.epoch,
            self.pool_continued,
        )

    def _dealer(self, endpoint: str, identity: str | None = None) -> zmq.Socket:
        sock = make_socket(
            self.ctx,
            zmq.DEALER,
            max_message_bytes=self.config.max_message_bytes,
            identity=identity,
            curve_client=self.keys,
        )
        sock.connect(endpoint)
        return sock

    def register_pool(self) -> None:
        """Block until the block manager holds our pool: a step must never name an unknown pool."""
        bm = self._dealer(self.config.block_manager_endpoint)
        try:
            while not self.stopping.is_set():
                send(bm, self.announcement(Register))
                if bm.poll(1000):
                    reply = read_message(decode(bm.recv()), _FROM_BLOCK_MANAGER)
                    if isinstance(reply, Registered):
                        self.pool_continued = reply.continued
                        self.log.info(
                            "pool_registered",
                            num_blocks=self.runner.num_blocks,
                            block_size=self.runner.block_size,
                            bm_instance=reply.instance,
                            pool_epoch=self.pool.epoch,
                            continued=reply.continued,
                        )
                        return
                    self.log.warning("register_refused", code=reply.code, error=reply.message)
                self.log.info("waiting_for_block_manager", endpoint=self.config.block_manager_endpoint)
        finally:
            bm.close(0)

    def heartbeat_loop(self) -> None:
        bm = self._dealer(self.config.block_manager_endpoint)
        sched = self._dealer(self.config.worker_endpoint, identity=f"{self.worker_id}/hb")
        beat = self.announcement(Heartbeat)
        interval_ms = max(1, int(self.config.heartbeat_interval_s * 1000))
        try:
            while not self.stopping.is_set():
                send(bm, beat)
                send(sched, beat)
                next_beat = time.monotonic() + self.config.heartbeat_interval_s
                while not self.stopping.is_set() and (left := next_beat - time.monotonic()) > 0:
                    # Short polls: a stop is seen within 100 ms, and so is a request for our stacks.
                    if sched.poll(min(100, interval_ms, max(1, int(left * 1000)))):
                        self._on_heartbeat_socket(sched.recv())
        finally:
            bm.close(0)
            sched.close(0)

    def _on_heartbeat_socket(self, frame: bytes) -> None:
        try:
            msg = read_message(decode(frame, self.config.max_message_bytes), _TO_HEARTBEAT)
        except ProtocolError as exc:
            self.log.warning("unexpected_message", socket="heartbeat", code=exc.code, error=exc.message)
            return
        # The scheduler sees one of our steps overdue: where is every thread of ours right now?
        self.log.error("dumping_stacks", reason="step overdue at the scheduler", step_age_s=msg.step_age_s)
        if sys.__stderr__ is not None:  # None where the process was started without a stderr
            faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)

    def serve(self) -> None:
        started = time.monotonic()
        self.register_pool()
        self.startup["register_s"] = round(time.monotonic() - started, 3)
        sched = self._dealer(self.config.worker_endpoint, identity=self.worker_id)
        connects = sched.get_monitor_socket(zmq.EVENT_CONNECTED)
        connection = 0  # how many times the step socket has connected
        beat = threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True)
        beat.start()
        self.log.info(
            "worker_started",
            endpoint=self.config.worker_endpoint,
            num_blocks=self.runner.num_blocks,
            **self.runner.runtime,  # dtype, attention backend, the ISA path of each C++ op
            **self.pool_facts(),  # how many tokens the pool holds, and how it was sized
            startup=self.startup,
            memory=self.memory,
            tensor_parallel_size=1 if self.group is None else self.group.shard.size,
            pool_epoch=self.pool.epoch,
            pool_continued=self.pool_continued,
        )
        last_sent = time.monotonic()
        last_hello = 0.0
        try:
            while not self.stopping.is_set():
                if self.group is not None:
                    self.group.check()  # a rank gone between steps: exit now, the group restarts whole
                if connects.poll(0):
                    # A (re)connected step socket: the scheduler's route to our name moves to it,
                    # and steps it sent on the old connection are gone. Say so now, busy or not.
                    while connects.poll(0):
                        connects.recv_multipart()
                        connection += 1
                    send(sched, self.announcement(Hello, connection))
                    last_hello = time.monotonic()
                if not sched.poll(100):
                    # While idle, say hello from THIS socket: the scheduler routes steps to it only
                    # once it has heard from it (after its own restart, this socket reconnects
                    # later than the heartbeat socket, and a step sent before would be lost).
                    if time.monotonic() - last_hello >= self.config.heartbeat_interval_s:
                        send(sched, self.announcement(Hello, connection))
                        last_hello = time.monotonic()
                    continue
                try:
                    msg = read_message(decode(sched.recv(), self.config.max_message_bytes), _FROM_SCHEDULER)
                except ProtocolError as exc:
                    self.log.warning("unexpected_message", code=exc.code, error=exc.message)
                    continue
                if isinstance(msg, Reset):
                    self.runner.requests.clear()  # every request state; the KV tensors stay allocated
                    self.generation = msg.generation
                    self.log.info("worker_state_reset", generation=msg.generation)
                    continue
                if failpoints.fire("worker.drop_execute"):
                    continue  # a lost Execute: the scheduler's step timeout must notice
                idle_s = time.monotonic() - last_sent
                execute = msg.execute
                try:
                    result = self.runner.execute(execute)
                except Exception:
                    self.log.exception("step_failed", step=execute.step)
                    raise
                result.timings["idle_s"] = idle_s
                if result.request_ids:
                    # A hang mid-reply: whoever SIGCONTs us sees a stale result go out.
                    failpoints.fire("worker.stop_before_result")
                failpoints.fire("worker.delay_reply")
                send(sched, StepResultMessage(self.worker_id, result, self.generation))
                last_sent = time.monotonic()
        finally:
            self.stopping.set()
            sched.disable_monitor()
            connects.close(0)
            sched.close(0)  # linger 0 (make_socket): nothing queued holds the exit
            beat.join(timeout=5)
            if beat.is_alive():
                # Its sockets are still open: ctx.term() would wait for them forever. Exiting
                # releases them anyway; a worker hung here would outlive its supervisor.
                self.log.warning("heartbeat_thread_still_running_at_exit")
            else:
                self.ctx.term()


def process_age_s() -> float:
    """Seconds since this process started (its /proc start time against the clock since boot)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def resident_mib() -> float | None:
    """This process's resident memory (VmRSS) in MiB, where /proc says (Linux); else None."""
    rss = resident_bytes()
    return None if rss is None else round(rss / 2**20, 1)


def ranks_per_machine(config: ServeConfig) -> int:
    """The processes of one worker sharing this machine's memory: a CPU group's ranks each hold a pool
    of as many blocks as rank 0's (of fewer heads), so rank 0 sizes it from its share of the budget."""
    return config.tensor_parallel_size if config.device == "cpu" else 1


# sysexits.h EX_CONFIG: the supervisor does not restart a child that refuses its configuration.
EXIT_CONFIG = 78


def run(config: ServeConfig, standby: bool = False) -> None:
    """`standby`: load the model, then wait on stdin for the name of a dead worker to become
    (standby.py); the supervisor keeps one such process warm to replace a worker at once."""
    try:
        service = WorkerService(config, named=not standby)
        if standby:
            from pagedserve.services.worker.standby import wait_for_name

            service.take_name(wait_for_name(config, service.log))
    except (PoolTooSmall, NameHeld, GroupRefused) as e:
        print(f"pagedserve worker: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)
    on_stop_signals(service.stopping.set)
    try:
        service.serve()
    except Exception:
        service.log.exception("worker_crashed")
        sys.exit(1)
    finally:
        service.pool.close()
        if service.group is not None:
            service.group.stop()
