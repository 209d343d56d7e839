"""A service that stalls (SIGSTOP) for longer than a worker may be silent, but shorter than anyone's
patience with requests, costs latency and nothing else.

- The block manager stopped: the steps waiting for its answers wait, never the scheduler's reading of
  its sockets (a client's ping is answered meanwhile).
- The scheduler stopped: the workers' heartbeats that queued up meanwhile are not taken for silence.

Either way the request finishes with the very tokens of a run without the stall, no worker is lost,
nothing counts as an outage, nothing leaks. Workers are simulated (no model): what is under test is
the control plane."""

from __future__ import annotations

import os
import signal
import threading
import time

import zmq
from harness.deployment import assert_no_leak, deployment_config, get_text, simulated_model

from pagedserve import Client
from pagedserve.ops.deploy.supervisor import Supervisor
from pagedserve.shared.protocol.codec import decode, encode

PROMPT = [11, 12, 13, 14, 15]
MAX_TOKENS = 200
STALL_S = 2.0  # longer than worker_timeout_s (1.5 s), shorter than rpc_timeout_s (set to 4 x)


def simulated_deployment(tmp_path) -> Supervisor:
    config = deployment_config(
        simulated_model(tmp_path), num_blocks=256, simulate_step_ms=10, rpc_timeout_s=4 * STALL_S
    )
    assert config.worker_timeout_s < STALL_S
    return Supervisor(config, workers=1, log_dir=tmp_path / "logs").start()


def stream_in_background(sup: Supervisor, kw: dict, got: dict) -> threading.Thread:
    streaming = threading.Event()

    def generate() -> None:
        with Client(sup.front_endpoint, timeout_s=60) as c:
            tokens: list[int] = []
            for delta in c.stream(**kw):
                tokens += delta.token_ids
                streaming.set()
            got["tokens"] = tokens

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    assert streaming.wait(30), "the request never streamed"
    return thread


def counter(sup: Supervisor, name: str) -> float:
    for line in get_text(f"{sup.scheduler_ops_url}/metrics").splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in the scheduler's metrics")


def run_through_a_stall(tmp_path, service: str, while_stopped) -> None:
    """A request streams while `service` is stopped (`while_stopped` runs meanwhile); then it ends with
    the tokens of a run without the stall, nobody lost, nothing leaked."""
    sup = simulated_deployment(tmp_path)
    try:
        sup.wait_ready(timeout_s=60)
        kw = {"prompt_token_ids": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
        with Client(sup.front_endpoint, timeout_s=60) as client:
            want = client.generate(**kw).token_ids
        got: dict = {}
        thread = stream_in_background(sup, kw, got)
        pid = sup.pid(service)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            while_stopped(sup, got)
        finally:
            os.kill(pid, signal.SIGCONT)
        thread.join(timeout=60)
        assert got["tokens"] == want
        assert counter(sup, "pagedserve_block_manager_outages_total") == 0
        assert counter(sup, "pagedserve_workers_lost_total") == 0
        assert_no_leak(sup, expect_pools=1)
    finally:
        sup.stop()


def test_pings_are_answered_while_the_block_manager_is_stopped(tmp_path):
    def ping_throughout(sup: Supervisor, got: dict) -> None:
        ctx = zmq.Context()
        probe = ctx.socket(zmq.DEALER)
        probe.connect(sup.front_endpoint)
        try:
            stopped_until = time.monotonic() + STALL_S
            pongs = 0
            while time.monotonic() < stopped_until - 0.5:
                probe.send(encode("ping", {}))
                assert probe.poll(int(STALL_S * 1000)), "the scheduler stopped reading its front socket"
                assert decode(probe.recv())["type"] == "pong"
                pongs += 1
                time.sleep(0.1)
            assert pongs >= 5
            assert "tokens" not in got  # it is still waiting for the block manager
        finally:
            probe.close(0)
            ctx.term()

    run_through_a_stall(tmp_path, "block-manager", ping_throughout)


def test_a_stopped_scheduler_does_not_take_its_workers_for_lost(tmp_path):
    run_through_a_stall(tmp_path, "scheduler", lambda sup, got: time.sleep(STALL_S))
