"""The generation fence, proved with a scripted worker on real sockets: a real scheduler and block
manager, and a worker played by this test (the simulated runner behind a raw DEALER) that hangs
with a step result computed, is declared lost, rejoins, and then sends that stale result, its step
number forged to match the new window. It must not be believed: the output is exactly what a
fault-free run gives, and the scheduler counts one fenced result."""

from __future__ import annotations

import threading
import time
import uuid

import zmq
from harness.deployment import deployment_config, get_text, simulated_model, workers_ready

from pagedserve import Client
from pagedserve.ops.deploy.supervisor import Supervisor
from pagedserve.services.worker.simulated import SimulatedRunner, fake_token
from pagedserve.shared.protocol.codec import decode
from pagedserve.shared.protocol.control import Heartbeat, Hello, Register, Reset
from pagedserve.shared.protocol.messages import encode_message, message_table, read_message
from pagedserve.shared.protocol.step import ExecuteMessage, StepResult, StepResultMessage

WORKER = "scripted-0"
PROMPT = [11, 12, 13, 14, 15]
MAX_TOKENS = 12
FORGED_TOKEN = 7  # never what the runner gives next: a believed stale result would show


class ScriptedWorker:
    def __init__(self, sup: Supervisor, model_path) -> None:
        self.ctx = zmq.Context()
        self.runner = SimulatedRunner(model_path, step_ms=5.0, block_size=16, num_blocks=64)
        fields = (
            WORKER,
            uuid.uuid4().hex,
            64,
            16,
            self.runner.max_model_len,
            "",
        )
        self.hello, self.beat, register = Hello(*fields), Heartbeat(*fields), Register(*fields)
        self.bm = self.ctx.socket(zmq.DEALER)
        self.bm.connect(sup.config.block_manager_endpoint)
        self.bm.send(encode_message(register))
        assert self.bm.poll(10_000), "the block manager never answered the registration"
        self.bm.recv()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, WORKER.encode())
        self.sock.connect(sup.config.worker_endpoint)
        self.generation = 0
        self.stop_beats = threading.Event()
        threading.Thread(target=self._beat_bm, daemon=True).start()  # the pool stays registered

    def _beat_bm(self) -> None:
        while not self.stop_beats.wait(0.3):
            self.bm.send(encode_message(self.beat))

    def next_message(self, timeout_s: float, say_hello: bool = True):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.sock.poll(300):
                return read_message(decode(self.sock.recv()), message_table(ExecuteMessage, Reset))
            if say_hello:
                self.sock.send(encode_message(self.hello))
        raise TimeoutError("the scheduler sent nothing")

    def until_reset(self, timeout_s: float = 15.0) -> int:
        """Say hello until a reset comes (discarding anything older); returns its generation."""
        while not isinstance(msg := self.next_message(timeout_s), Reset):
            pass
        self.runner.requests.clear()
        self.generation = msg.generation
        return msg.generation

    def answer(self, result: StepResult, generation: int) -> None:
        self.sock.send(encode_message(StepResultMessage(WORKER, result, generation)))

    def close(self) -> None:
        self.stop_beats.set()
        self.ctx.destroy(0)


def stale_results(sup: Supervisor) -> float:
    for line in get_text(f"{sup.scheduler_ops_url}/metrics").splitlines():
        if line.startswith("pagedserve_stale_step_results_total "):
            return float(line.split()[1])
    return 0.0


def test_a_stale_result_with_a_matching_step_number_is_fenced_off(tmp_path):
    model = simulated_model(tmp_path, max_len=256)
    sup = Supervisor(deployment_config(model, num_blocks=64), workers=0, log_dir=tmp_path / "logs").start()
    worker = None
    try:
        worker = ScriptedWorker(sup, model)
        first = worker.until_reset()
        outcome: dict = {}

        def client() -> None:
            with Client(sup.front_endpoint, timeout_s=60) as c:
                outcome["result"] = c.generate(
                    prompt_token_ids=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True
                )

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        step = worker.next_message(15)
        assert isinstance(step, ExecuteMessage)
        held = worker.runner.execute(step.execute)  # computed, never sent: the worker hangs here
        assert held.request_ids
        # Silent now (no hello, no result): the scheduler declares it lost after worker_timeout_s.
        deadline = time.monotonic() + 10
        while WORKER in workers_ready(sup) or time.monotonic() < deadline - 9.5:
            assert time.monotonic() < deadline, "the silent worker was never declared lost"
            time.sleep(0.1)
        # It wakes up and rejoins: a new reset, a new generation, the request recomputed from scratch.
        second = worker.until_reset()
        assert second != first
        recompute = worker.next_message(15)
        assert isinstance(recompute, ExecuteMessage)
        forged = StepResult(recompute.execute.step, held.request_ids, [FORGED_TOKEN] * len(held.request_ids))
        worker.answer(forged, first)  # the stale reply, forged to match the new window's step
        msg = recompute
        while thread.is_alive():
            if isinstance(msg, ExecuteMessage):
                worker.answer(worker.runner.execute(msg.execute), worker.generation)
            elif isinstance(msg, Reset):
                worker.runner.requests.clear()
                worker.generation = msg.generation
            try:
                msg = worker.next_message(0.5)
            except TimeoutError:
                msg = None
        thread.join(5)
        tokens = outcome["result"].token_ids
        expected: list[int] = []
        chain = list(PROMPT)
        for _ in range(MAX_TOKENS):
            chain.append(fake_token(chain[-1], len(chain), 320))
            expected.append(chain[-1])
        assert tokens == expected
        assert FORGED_TOKEN not in tokens
        assert stale_results(sup) >= 1
    finally:
        if worker is not None:
            worker.close()
        sup.stop()
